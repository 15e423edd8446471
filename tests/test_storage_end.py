"""A finished run's records in ``run.storage``: the metric log, deaths and flow matrices of every step.

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
