"""A job's tracker resumed into a new MLflow store, as on a new head (``run.storage`` brought the run
folder's records, not the lost head's ``mlflow.db``): the tests of the metric log's replay share it."""

from __future__ import annotations

import warnings
from pathlib import Path

from dashboards.tracking import Tracker


def checkpoint_record(tracker: Tracker, step: int) -> dict:
    """What ``save_checkpoint`` keeps of the tracker (``orchestrator.controller.checkpoint``)."""
    return {"experiment_id": tracker.experiment_id, "parent_run_id": tracker.parent_id,
            "child_run_ids": dict(tracker.child_ids), "step": step}


def resumed_into(uri: str, config: dict, folder: Path, record: dict) -> Tracker:
    """Job ``job`` of experiment ``exp`` (model ``a``) resumed from ``record`` into the store at ``uri``,
    which has none of its runs: MLflow's warning that it has no run to resume is expected."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "MLflow has no run ... to resume": new runs
        return Tracker(uri, "exp", "job", config, ["a"], folder, resume=record)


def killed_then_resumed_on_a_new_head(old: Tracker, step: int, config: dict, folder: Path, status: str) -> Tracker:
    """``old``'s job ended with ``status`` after its checkpoint of ``step``, then resumed from that
    checkpoint into a new sqlite store in ``folder`` (``new-head.db``) and finished there."""
    record = checkpoint_record(old, step)
    old.finish(status)
    new = resumed_into(f"sqlite:///{folder / 'new-head.db'}", config, folder / "job", record)
    new.finish()
    return new


def metric_history(tracker: Tracker, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value to 6 places) of ``key`` in ``run_id`` of ``tracker``'s store, in order."""
    from mlflow.tracking import MlflowClient

    history = MlflowClient(tracking_uri=tracker.uri).get_metric_history(run_id, key)
    return sorted((m.step, round(m.value, 6)) for m in history)
