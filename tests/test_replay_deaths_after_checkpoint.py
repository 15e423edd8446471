"""A job resumed into a new MLflow store (a new head's, after ``ray down``; ``run.storage`` brought its
records) replays ``metrics.jsonl``'s values up to the checkpoint, and the deaths after it too: they stay
on record (``faults.jsonl``, ``summary.json``, their ``graftpool.fault.<ms>`` tags; docs/operations.md,
"Faults on record") and the resumed job, which goes on from the checkpoint, never logs them again."""

from __future__ import annotations

import warnings
from pathlib import Path

from mlflow.tracking import MlflowClient

from dashboards.tracking import Tracker
from tests.netcut import free_port
from tests.tracking_resume import checkpoint_record, resumed_into

CONFIG = {"run": {"steps": 6}}


def killed_job(uri: str, folder: Path) -> Tracker:
    """Steps 1-4 of a job checkpointed at step 2: a replica lost at step 3 and recovered, then a
    trainer rank lost at step 4 past the restart budget, which stops the run (its records go to
    ``run.storage`` as the run stops)."""
    old = Tracker(uri, "exp", "job", CONFIG, ["a"], folder, retry_after_s=3600)
    for step in (1, 2, 3):
        old.log(step, {"train/reward_mean": step / 10}, model="a")
    replica = {"step": 3, "phase": "step 3", "stage": "generate", "actor": "a/replica_0", "kind": "generator",
               "action": "recreated it and retried step 3", "time": 1000.0}
    old.log_fault(3, replica, deaths=1)
    old.log(3, {"faults/restarts/a/replica_0": 1.0})
    old.log_fault(3, {**replica, "recovery_s": 5.5})
    trainer = {"step": 4, "phase": "step 4", "stage": "train", "actor": "a/trainer_0", "kind": "trainer",
               "action": "stopped the run", "error": "a/trainer_0 died", "time": 2000.0}
    old.log_fault(4, trainer, deaths=2)
    return old


def replayed(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=uri)
    return {key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
            for key in client.get_run(run_id).data.metrics}


DEATHS = {"faults/generator": [(3, 1.0)], "faults/deaths": [(3, 1.0), (4, 2.0)], "faults/recovery_s": [(3, 5.5)],
          "faults/restarts/a/replica_0": [(3, 1.0)], "faults/trainer": [(4, 1.0)], "faults/fatal": [(4, 1.0)]}


def test_a_job_resumed_on_a_new_head_replays_the_deaths_after_its_checkpoint(tmp_path):
    old = killed_job(f"sqlite:///{tmp_path / 'lost-head.db'}", tmp_path / "job")
    ids = checkpoint_record(old, 2)
    old.finish("FAILED")

    uri = f"sqlite:///{tmp_path / 'new-head.db'}"
    new = resumed_into(uri, CONFIG, tmp_path / "job", ids)
    new.log_fault(3, {"step": 3, "phase": "step 3", "stage": "verify", "actor": "verifier_0", "kind": "verifier",
                      "action": "recreated it and retried step 3", "time": 3000.0}, deaths=3)
    new.log(3, {"train/reward_mean": 0.35}, model="a")
    new.finish()
    pool = replayed(uri, new.parent_id)
    assert {key: pool.get(key) for key in DEATHS} == {
        **DEATHS, "faults/deaths": [(3, 1.0), (3, 3.0), (4, 2.0)]}, "the deaths after the checkpoint were not replayed"
    assert pool["faults/verifier"] == [(3, 1.0)]  # the resumed job's own death, once
    assert replayed(uri, new.child_ids["a"])["train/reward_mean"] == [(1, 0.1), (2, 0.2), (3, 0.35)]


def test_a_job_that_never_reached_its_store_replays_its_deaths_after_the_checkpoint_too(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unreachable
        old = killed_job(f"http://127.0.0.1:{free_port()}", tmp_path / "job")
        old.finish("FAILED")
    uri = f"sqlite:///{tmp_path / 'store.db'}"
    resume = {"experiment_id": None, "parent_run_id": None, "child_run_ids": {}, "step": 2}
    new = Tracker(uri, "exp", "job", CONFIG, ["a"], tmp_path / "job", resume=resume)
    new.finish()
    pool = replayed(uri, new.parent_id)
    assert {key: pool.get(key) for key in DEATHS} == DEATHS, "the deaths after the checkpoint were not replayed"
    assert replayed(uri, new.child_ids["a"])["train/reward_mean"] == [(1, 0.1), (2, 0.2)]
