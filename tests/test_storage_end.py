"""A finished run's records in ``run.storage``: the metric log, deaths and flow matrices of every step;
a stopped run's deaths.

Issue #51's twentieth read: the records reached storage only with a checkpoint's upload, so a run
without checkpoints left no ``metrics.jsonl`` there, and the steps (and the final evaluation) after
a run's last checkpoint were in no copy but the head's run folder, which ``ray down`` takes; a
``dashboards report`` of the folder pulled from storage showed the run ending at its last checkpoint."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_a_finished_run_leaves_its_whole_metric_log_in_storage(tmp_path, ray_local):
    from orchestrator.config import load_config
    from orchestrator.controller.loop import Controller

    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["verifier_actors"] = 1
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    shared = tmp_path / "shared"
    Controller(load_config(tmp_path / "job.yaml", [
        "run.steps=2", "run.eval_every=0", "run.name=job", f"run.storage={shared.as_uri()}",
        "run.checkpoint_every=0", "algorithm.prompt_batch=4", f"run.output_dir={tmp_path / 'head'}"])).run()
    head = tmp_path / "head" / "job"
    for name in ("metrics.jsonl", "flow_matrix.json"):
        assert (head / name).is_file()
        stored = shared / "job" / name
        assert stored.is_file(), f"run.storage holds no {name} of the finished run: {sorted(p.name for p in (shared / 'job').iterdir())}"
        assert stored.read_bytes() == (head / name).read_bytes(), f"run.storage's {name} is not the run's"


def test_a_stopped_runs_deaths_reach_storage(tmp_path, ray_local, monkeypatch, capsys):
    """A run stopped by a death (its replica SIGKILLed at every start, past ``run.max_restarts``) left
    its deaths since the last checkpoint, the one that stopped it among them, only in the head's
    ``faults.jsonl``: the records went to ``run.storage`` with a checkpoint or at a finished run's end
    only, so a resume on a new head (``ray down``, then ``ray up``) lost them from the run's report
    (issue #51's fortieth read, half a). The stop line names Ray's reason for the death too."""
    import json
    import shutil

    from orchestrator.cli import main
    from orchestrator.controller import loop
    from tests.reference_run import DEMO, overrides
    from tests.test_startup_faults import AlwaysDying

    data = yaml.safe_load(DEMO.read_text())
    data["models"], data["exchange"] = data["models"][:1], {"name": "none"}  # one model: cheaper
    config = tmp_path / "doomed.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setattr(loop, "Controller", AlwaysDying)
    shared = tmp_path / "shared"
    sets = [arg for s in overrides(tmp_path, "doomed", ["run.max_restarts=1", f"run.storage={shared.as_uri()}"])
            for arg in ("--set", s)]
    assert main(["run", str(config), *sets]) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "The actor is dead because its worker process has died." in last, last
    stored = shared / "doomed" / "faults.jsonl"
    assert stored.is_file(), f"run.storage holds no faults.jsonl of the stopped run: {sorted(p.name for p in stored.parent.iterdir())}"
    actions = [json.loads(line).get("action") for line in stored.read_text().splitlines()]
    assert "stopped the run" in actions, actions
    assert stored.read_bytes() == (tmp_path / "doomed" / "faults.jsonl").read_bytes()

    # a new run of the name (no --resume: the stopped one has no checkpoint) replaces those deaths: the
    # run folder's (which the tracker appends to, and the report would count as the new run's), then
    # storage's at the new run's first upload of its records (or a resume on a new head would take them)
    from orchestrator.config import load_config
    from orchestrator.controller.checkpoint import prepare_run_dir
    from orchestrator.controller.run_storage import open_storage

    # what the stop line says to do (no checkpoint: "--resume would start it again at step 1") starts a run
    # anew too, under new MLflow runs: its report (read from faults.jsonl) counted the earlier job's deaths,
    # "stopped the run" among them, which its summary.json and its runs' tags left out (the forty-first read)
    resumed = load_config(config, overrides(tmp_path, "doomed", [f"run.storage={shared.as_uri()}", "run.resume=true"]))
    assert prepare_run_dir(tmp_path / "doomed", resumed, open_storage(resumed.run.storage, tmp_path / "doomed", True)) is None
    assert not (tmp_path / "doomed" / "faults.jsonl").exists(), "the resume started again keeps the stopped job's deaths"
    shutil.copy(stored, tmp_path / "doomed" / "faults.jsonl")  # as it stood, for the run of the name below

    fresh = load_config(config, overrides(tmp_path, "doomed", [f"run.storage={shared.as_uri()}"]))
    storage = open_storage(fresh.run.storage, tmp_path / "doomed", resume=False)
    assert prepare_run_dir(tmp_path / "doomed", fresh, storage) is None
    assert not (tmp_path / "doomed" / "faults.jsonl").exists(), "the new run keeps the stopped run's deaths"
    storage.mirror_records()
    assert not stored.exists(), "run.storage keeps the stopped run's deaths for the new run"
