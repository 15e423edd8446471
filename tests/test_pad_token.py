"""A Llama-3-style tokenizer (no pad token, ``tests/llama3_style.py``) loads everywhere with EOS as its
pad token, said once; ``models[].pad_token`` overrides it; generation and a trainer update run on it,
and the EOS that ends a response keeps its log-prob although it is also the pad token. Real tiny
model and tokenizer built here, no Ray (the run through Ray: tests/test_hub_models.py)."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from graftpool.tasks import generate_problems
from orchestrator.cluster.model_actors import trainer_settings
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import Controller
from tests.llama3_style import EOS, RESERVED_PAD, build_llama3_style
from tests.tiny_pair import batch_of, build_groups, prepared
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.settings import GenerationSettings
from workers.rollout.tokenizer import load_tokenizer
from workers.training.trainer import TorchTrainer

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"


@pytest.fixture(scope="module")
def llama3(tmp_path_factory) -> Path:
    return build_llama3_style(tmp_path_factory.mktemp("llama3"))


def test_no_pad_token_pads_with_eos_said_once(llama3, tmp_path):
    folder = shutil.copytree(llama3, tmp_path / "llama3")  # a folder this process has not loaded yet
    with pytest.warns(UserWarning, match=r"no pad token; padding with its EOS token '<\|eot_id\|>'"):
        tok = load_tokenizer(folder)
    assert tok.pad_token == EOS and tok.pad_token_id == tok.eos_token_id and tok.padding_side == "left"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the second load of the same folder in this process says nothing
        assert load_tokenizer(folder).pad_token_id == tok.eos_token_id


def test_pad_token_override_reaches_generation_and_trainer(llama3):
    pad_id = load_tokenizer(llama3, pad_token=RESERVED_PAD).pad_token_id
    assert pad_id == load_tokenizer(llama3).convert_tokens_to_ids(RESERVED_PAD) != load_tokenizer(llama3).eos_token_id
    generation = HFGeneration.from_settings(GenerationSettings(path=str(llama3), pad_token=RESERVED_PAD))
    assert generation.tokenizer.pad_token_id == pad_id
    assert TorchTrainer(llama3, pad_token=RESERVED_PAD).tokenizer.pad_token_id == pad_id
    with pytest.raises(ValueError, match=r"models\[\].pad_token '<pad>' is not a token of the tokenizer"):
        load_tokenizer(llama3, pad_token="<pad>")


def _config(llama3: Path, tmp_path: Path, **model):
    data = yaml.safe_load(DEMO.read_text())
    data["models"] = [{"name": "llama3", "path": str(llama3), **model}, data["models"][0]]
    return load_config(data=data, overrides=[f"run.output_dir={tmp_path}"])


def test_pad_token_is_checked_at_load(llama3, tmp_path):
    config = _config(llama3, tmp_path, pad_token=RESERVED_PAD)
    settings = trainer_settings(config.models[0], config.algorithm, config.exchange, seed=0, lora=None,
                                sync_dtype="float32", num_threads=1)
    assert settings.pad_token == RESERVED_PAD
    with pytest.raises(ConfigError, match=r"models.0.pad_token"):
        _config(llama3, tmp_path, pad_token="")
    controller = Controller(_config(llama3, tmp_path, pad_token="<pad>"))
    with pytest.raises(ConfigError, match=r"models.llama3: models\[\].pad_token '<pad>' is not a token"):
        controller.start()
    assert not hasattr(controller, "actors")


def test_generation_and_update_train_a_model_without_pad_token(llama3):
    """Generation samples with EOS as the pad token, and the trainer scores and updates on what it
    sampled: weights change, the loss is finite."""
    torch.manual_seed(0)
    problems = generate_problems(["add"], 2, seed=3, split="train")
    completions = HFGeneration(llama3).generate([p.prompt for p in problems], SamplingParams(n=4, max_new_tokens=12))
    assert all(c.prompt.startswith("<|begin_of_text|><|start_header_id|>user") for c in completions)
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]])
    groups = build_groups("llama3", problems, completions, rewards, [[""] * 4] * 2)
    trainer = TorchTrainer(llama3, lr=1e-2, minibatches=1, seed=0)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.train(prepared(trainer.score, batch_of(groups)))
    assert np.isfinite(result.metrics["train/loss"])
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_eos_that_pads_keeps_its_logprob(llama3):
    """Rows of different lengths that end with EOS (= the pad token), padded together: each row's
    EOS is in the mask with the log-prob the row gets alone, unpadded."""
    trainer = TorchTrainer(llama3, seed=0)
    tok = trainer.tokenizer
    eos = tok.eos_token_id
    assert tok.pad_token_id == eos
    prompt = trainer._prompt_ids("What is 1+1?")
    rows = token_rows([prompt, prompt], [tok("2", add_special_tokens=False)["input_ids"] + [eos],
                                         tok("The answer is 2", add_special_tokens=False)["input_ids"] + [eos]])
    with torch.no_grad():
        logp, mask = trainer._logprobs(rows)
        for b, response in enumerate(rows["response_ids"]):
            last = len(response) - 1
            assert mask[b, last] == 1 and mask[b, last + 1:].sum() == 0
            alone, _ = trainer._logprobs(rows.select([b]))
            assert logp[b, last] != 0
            torch.testing.assert_close(logp[b, : last + 1], alone[0, : last + 1], atol=1e-5, rtol=1e-5)


def test_final_export_keeps_the_pad_token(llama3, tmp_path):
    trainer = TorchTrainer(llama3, pad_token=RESERVED_PAD)
    trainer.export(tmp_path / "final")
    saved = json.loads((tmp_path / "final" / "tokenizer_config.json").read_text())
    assert saved["pad_token"] == RESERVED_PAD
    assert load_tokenizer(tmp_path / "final").pad_token == RESERVED_PAD
