"""After a GPU out-of-memory error stops a job, docs/operations.md says to lower what the step
holds, then ``--resume``. The resume compared the whole ``models`` section with the run folder's
config and refused any change there (``--resume: the config differs ... in
models.0.trainer.max_tokens_per_micro_batch``), so the advice could not be followed: the run
could only start over. A model's memory settings (``checkpoint.MEMORY_CHANGES``) may now change
on a resume, said in a warning; any other model field is still refused.

A real one-step run of one demo model with a checkpoint, then a real resume with a token budget
and gradient checkpointing set, which trains step 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config import ConfigError
from orchestrator.controller.loop import Controller
from tests.shared_runs import one_model_config

SETS = ["run.eval_every=0", "run.name=oom", "run.checkpoint_every=1", "algorithm.prompt_batch=8",
        "eval.max_prompts=4", "eval.samples=2", "data.verifier_actors=1", "tracking.views=false"]


def _config(tmp_path: Path, *sets: str):
    return one_model_config(tmp_path, "oom", [*SETS, *sets])


@pytest.mark.slow
def test_a_resume_takes_lowered_memory_settings_and_refuses_other_model_changes(ray_local, tmp_path):
    Controller(_config(tmp_path, "run.steps=1")).run()
    run_dir = tmp_path / "runs" / "oom"

    with pytest.raises(ConfigError, match=r"differs .* in models\.0\.trainer\.lr.*set those fields back .*another run\.name"):
        Controller(_config(tmp_path, "run.steps=2", "run.resume=true", "models.0.trainer.lr=1e-3")).run()

    lowered = ["models.0.trainer.max_tokens_per_micro_batch=256", "models.0.trainer.gradient_checkpointing=true"]
    with pytest.warns(UserWarning, match=r"memory settings changed .*max_tokens_per_micro_batch None -> 256"):
        Controller(_config(tmp_path, "run.steps=2", "run.resume=true", *lowered)).run()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2
    assert sorted(p.name for p in (run_dir / "trajectories").iterdir()) == ["step_000001.parquet", "step_000002.parquet"]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["models"][0]["trainer"]
    assert (saved["max_tokens_per_micro_batch"], saved["gradient_checkpointing"]) == (256, True)
