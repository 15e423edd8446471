"""``--resume`` of a run whose reward plugin is a file of the project, from another copy of it.

README's own-models snippet names ``data.verifier: python:examples/reward_plugin.py:length_penalised``
and submits the run with ``ray job submit --working-dir .``: each job runs in its own unpacked
copy of the project (``<session>/runtime_resources/working_dir_files/_ray_pkg_<content hash>``),
so a job re-submitted with ``--resume`` after a head restart (a new session folder) or an edit
of the project (a new hash) runs from another folder. The config made the plugin's path
absolute when it was read, and ``prepare_run_dir`` compared it with the run folder's: every such
re-submission was refused ("the config differs ... in data.verifier"), a resume that
operations.md says goes on from the latest checkpoint (issue #51's twenty-ninth read). Now the
config keeps the path as written and the driver makes it absolute for the verifier actors.

A real one-step run of one demo model with the example plugin, from one copy; the first copy
removed; the real resume check from a second copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.controller.checkpoint import latest_checkpoint, prepare_run_dir
from orchestrator.controller.loop import Controller

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = "python:examples/reward_plugin.py:length_penalised"
SETS = ["run.eval_every=0", "run.name=plugged", "run.checkpoint_every=1", "run.steps=1",
        "algorithm.prompt_batch=8", "eval.max_prompts=4", "eval.samples=2", "data.verifier_actors=1",
        "tracking.views=false", f"data.verifier={PLUGIN}"]


def _copy(tmp_path: Path, name: str) -> Path:
    """One unpacked copy of the project, as a job's working directory holds it (what this test reads)."""
    copy = tmp_path / name
    (copy / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "reward_plugin.py", copy / "examples" / "reward_plugin.py")
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    (copy / "one.yaml").write_text(yaml.safe_dump(config, sort_keys=False))  # key order: the zoo cache key
    return copy


def test_a_resume_from_another_copy_of_the_project_takes_the_same_plugin_file(
        ray_local, tmp_path, monkeypatch: pytest.MonkeyPatch):
    runs = tmp_path / "runs"  # the template's run.output_dir: absolute, outside the job's copy
    first = _copy(tmp_path, "job1")
    monkeypatch.chdir(first)
    summary = Controller(load_config("one.yaml", [*SETS, f"run.output_dir={runs}"])).run()
    assert summary["steps"] == 1, "the verifier actors found the plugin file (relative to the driver's copy)"
    run_dir = runs / "plugged"
    latest = latest_checkpoint(run_dir)
    assert latest is not None

    second = _copy(tmp_path, "job2")  # the re-submitted job's copy; the first one is gone
    monkeypatch.chdir(second)
    shutil.rmtree(first)
    resumed = load_config("one.yaml", [*SETS, f"run.output_dir={runs}", "run.resume=true", "run.steps=2"])
    assert prepare_run_dir(run_dir, resumed) == latest
