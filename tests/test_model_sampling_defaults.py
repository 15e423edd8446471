"""The ``hf`` backend samples what ``models[].generation`` says, whatever sampling defaults the
model folder's ``generation_config.json`` holds (``workers/rollout/sampling_only.py``).

README's own-models example names ``Qwen/Qwen2.5-1.5B-Instruct``, whose file sets
``repetition_penalty: 1.1`` beside its temperature, top-p and top-k; the default generation
backend is ``hf``. A real tiny Llama-3-style folder is saved twice with the same weights, once
with that file's sampling fields, and both are sampled through the real backend: the responses,
greedy and at temperature 1, and their log-probs must be the same."""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import GenerationConfig

from tests.llama3_style import build_llama3_style
from workers.rollout.generation import HFGeneration, SamplingParams

PROMPTS = ["12+35= Output the final answer within \\boxed{}.", "7-3= Output the final answer within \\boxed{}."]
# Qwen2.5-1.5B-Instruct's generation_config.json, its sampling fields
INSTRUCT_DEFAULTS = {"do_sample": True, "repetition_penalty": 1.1, "temperature": 0.7, "top_p": 0.8, "top_k": 20}


def _folders(tmp_path: Path) -> tuple[Path, Path]:
    plain = build_llama3_style(tmp_path / "plain")
    instruct = tmp_path / "instruct"
    shutil.copytree(plain, instruct)
    config = GenerationConfig.from_pretrained(instruct)
    for key, value in INSTRUCT_DEFAULTS.items():
        setattr(config, key, value)
    config.save_pretrained(instruct)
    assert GenerationConfig.from_pretrained(instruct).repetition_penalty == 1.1
    return plain, instruct


def _sample(folder: Path, params: SamplingParams):
    completions = HFGeneration(folder, seed=0).generate(PROMPTS, params)
    return [c.token_ids for c in completions], [c.logprobs for c in completions]


def test_the_hf_backend_ignores_the_model_files_sampling_defaults(tmp_path):
    plain, instruct = _folders(tmp_path)
    for params in (SamplingParams(n=2, temperature=0.0, max_new_tokens=12),
                   SamplingParams(n=4, temperature=1.0, top_p=1.0, max_new_tokens=12)):
        want_ids, want_lps = _sample(plain, params)
        got_ids, got_lps = _sample(instruct, params)
        assert got_ids == want_ids, f"temperature {params.temperature}: {got_ids} != {want_ids}"
        assert got_lps == want_lps
