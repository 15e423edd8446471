"""``--resume`` of a run folder that holds no checkpoint, with another config.

operations.md: "A resume whose config differs in models, data, algorithm, exchange or seed is
refused". The comparison ran only where the folder had a checkpoint; a run of
``run.checkpoint_every: 0`` (the default; README's ``graftpool run configs/demo_pair.yaml --set
run.steps=20 --set exchange.name=none``) keeps none once finished, so README's next line, ``graftpool
run configs/demo_pair.yaml --set run.checkpoint_every=5 --resume``, started another run (GRAFT, 8
steps) in that folder and replaced the finished run's store, evaluations, final models and
summary (issue #51's twenty-eighth read). Now such a resume is refused, naming the fields, before
any actor starts; the same config still starts again at step 1, as operations.md says.

A real one-step run of one demo model, then the real resume path."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import ConfigError
from orchestrator.controller.checkpoint import latest_checkpoint, prepare_run_dir
from orchestrator.controller.loop import Controller
from tests.shared_runs import one_model_config

SETS = ["run.eval_every=0", "run.name=nockpt", "run.checkpoint_every=0", "run.steps=1", "algorithm.prompt_batch=8",
        "eval.max_prompts=4", "eval.samples=2", "data.verifier_actors=1", "tracking.views=false"]


def _config(tmp_path: Path, *sets: str):
    return one_model_config(tmp_path, "one", [*SETS, *sets])


def test_a_resume_with_another_config_of_a_run_without_checkpoints_is_refused(ray_local, tmp_path):
    Controller(_config(tmp_path)).run()
    run_dir = tmp_path / "runs" / "nockpt"
    assert latest_checkpoint(run_dir) is None, "checkpoint_every 0: the finished run keeps no checkpoint"
    kept = {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}
    assert any(p.parent.name == "trajectories" for p in kept) and (run_dir / "summary.json") in kept

    with pytest.raises(ConfigError, match=r"--resume: the config differs .* in models\.0\.trainer\.lr.*no checkpoint"):
        Controller(_config(tmp_path, "run.resume=true", "models.0.trainer.lr=1e-3")).run()
    assert {p: p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()} == kept, "the run's files are whole"
    # the same config is no change: it starts again at step 1 (no checkpoint to resume from)
    assert prepare_run_dir(run_dir, _config(tmp_path, "run.resume=true")) is None


def test_a_resume_without_checkpoint_drops_the_earlier_runs_step_files_in_storage_too(ray_local, tmp_path):
    """A job of a ``run.storage`` run stopped before its first checkpoint is re-submitted with
    ``--resume`` (as the refusal of a fresh run there says): it starts again at step 1, dropping the
    earlier run's store files from the run folder. Storage kept them, so when the new run stopped
    short of the earlier one's last step (here: ``run.steps`` 1 after 2), ``run.storage`` (the copy
    that outlives the head) held this run's step 1 beside the earlier run's step 2, one store made of
    two runs. Now storage forgets them as the folder does (issue #51's twenty-ninth read)."""
    storage = f"run.storage={(tmp_path / 'shared').as_uri()}"
    Controller(_config(tmp_path, storage, "run.steps=2")).run()
    stored = tmp_path / "shared" / "nockpt" / "trajectories"
    assert sorted(p.name for p in stored.glob("step_*")) == ["step_000001.parquet", "step_000002.parquet"]

    Controller(_config(tmp_path, storage, "run.steps=1", "run.resume=true")).run()
    local = tmp_path / "runs" / "nockpt" / "trajectories"
    assert sorted(p.name for p in local.glob("step_*")) == ["step_000001.parquet"]
    assert sorted(p.name for p in stored.glob("step_*")) == ["step_000001.parquet"], \
        "run.storage keeps the earlier run's later steps beside this run's"
    assert (stored / "step_000001.parquet").read_bytes() == (local / "step_000001.parquet").read_bytes()
