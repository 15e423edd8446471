"""``graftpool eval`` of a run folder copied back from the GPU template's cluster, where the head's
model folders (``/models/...``), data files (``/data/...``) and the vLLM and DeepSpeed packages are not (issue #51's
thirty-third read).

An evaluation starts no trainer, and ``--endpoint`` loads no weights at all, yet both validated the
run's ``config.yaml`` as a training job does: both refused the folder for the head's train file,
which an evaluation does not use, ``eval --endpoint`` also for the head's model paths and for both
backends' packages, ``eval`` for the trainer's (DeepSpeed: "install the [deepspeed] extra (GPU)"). Now both read the final models' folders as the models, ``--endpoint``
asks for no backend and ``eval`` for the generation backend only. The run folder is the demo's
llama-char as a finished run (``tests/served_run.py``) with the template's backends and a head's
path and train file written into its config; the endpoint is ``tests/test_endpoint_verifier.py``'s plain
OpenAI-compatible server on 127.0.0.1. Run in ``.venv``, which has neither vLLM nor DeepSpeed."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.chat_endpoint import boxed_choices, chat_endpoint
from tests.served_run import served_run_folder


def copied_back(tmp_path):
    """The demo model's run folder with the GPU template's model settings in its ``config.yaml``."""
    run_dir = served_run_folder(tmp_path, "copied")
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["models"][0].update(path="/models/llama-char", builder=None)
    config["models"][0]["generation"]["backend"] = "vllm"
    config["models"][0]["trainer"].update(backend="deepspeed", workers=2)
    config["data"]["eval"] = config["data"]["eval"][:1]
    config["eval"] = {"samples": 1, "max_prompts": 2}
    config["exchange"] = {"name": "none"}  # served_run_folder keeps one model of the pair
    config["data"]["train"] = {"name": "train", "source": "parquet", "path": "/data/math/train.parquet"}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def test_eval_endpoint_scores_a_copied_back_run_without_the_heads_models_or_packages(tmp_path):
    from orchestrator.serving.endpoint_eval import evaluate_endpoint

    run_dir = copied_back(tmp_path)
    with chat_endpoint(lambda body: (200, boxed_choices(body))) as url, \
            pytest.warns(UserWarning, match="/data/math/train.parquet is not on this machine"):
        scores = evaluate_endpoint(run_dir, url)
    assert set(scores) == {"llama-char"} and set(scores["llama-char"]) == {"add", "avg"}


def test_eval_of_a_copied_back_run_asks_for_no_trainer_package(tmp_path):
    from orchestrator.config import ConfigError
    from orchestrator.config.final_models import final_models_config

    run_dir = copied_back(tmp_path)
    config = final_models_config(run_dir, ["models.0.generation.backend=hf"])
    assert (config.models[0].path, config.models[0].trainer.backend) == (run_dir / "final" / "llama-char", "deepspeed")
    try:  # the generation backend is still asked for: the evaluation runs it
        final_models_config(run_dir)
    except ConfigError as exc:
        assert "'vllm' needs the 'vllm' package" in str(exc) and "deepspeed" not in str(exc)
    else:
        raise AssertionError("a vllm replica was accepted where vllm is not installed")


def test_eval_of_a_copied_back_run_starts_without_the_trainers_package(tmp_path, ray_local):
    """The whole evaluation on local Ray: its replicas start without importing the DeepSpeed trainer."""
    from orchestrator.cli import evaluate_run

    scores = evaluate_run(copied_back(tmp_path), ["models.0.generation.backend=hf", "eval.max_prompts=1"])
    assert set(scores["llama-char"]) == {"add", "avg"}


def test_eval_of_a_renamed_copy_keeps_its_records_in_that_folder(tmp_path, monkeypatch):
    """A copy under a name of its own (or ``graftpool eval .`` inside it) is the evaluation's run folder:
    its ``metrics.eval.jsonl`` and ``mlflow.eval.json`` go there, not into ``<parent>/<run.name>``, where
    another run of that name keeps its own (issue #51's thirty-fourth read)."""
    from orchestrator.config import ConfigError
    from orchestrator.config.final_models import final_models_config
    from orchestrator.controller.loop import Controller

    renamed = copied_back(tmp_path).rename(tmp_path / "pair-3b-dec07")
    (tmp_path / "copied").mkdir()  # another run folder of the same run.name beside it
    with pytest.warns(UserWarning, match="not on this machine"):
        config = final_models_config(renamed, ["models.0.generation.backend=hf"])
    assert Controller(config).run_dir.resolve() == renamed.resolve()
    monkeypatch.chdir(renamed)
    with pytest.warns(UserWarning, match="not on this machine"):
        config = final_models_config(Path("."), ["models.0.generation.backend=hf"])
    assert Controller(config).run_dir.resolve() == renamed.resolve()
    spaced = renamed.rename(tmp_path / "pair 3b")  # a name no run may have: refused, naming the folder
    with pytest.raises(ConfigError, match="pair 3b: an evaluation's run folder is the folder itself"):
        final_models_config(spaced)
