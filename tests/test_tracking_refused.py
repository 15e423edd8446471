"""A value the run's SQL MLflow store refuses is dropped, not taken for an outage.

MLflow refuses a metric key over 250 characters; a run logs one where a task name is long (a data
file's ``task_field`` column: ``exchange/task/<task>/all_fail_rate``), as for a long model or eval
set name. The tracker dropped a refused batch only when a tracking *server* refused it
(``RestException``, HTTP 4xx); the default store, the head's ``sqlite:///.../mlflow.db``, raises
a plain ``MlflowException``, which the tracker took for an outage: the refused batch stayed first in
its queue, so nothing the job logged after it reached MLflow, retried every 30 s for the whole job,
the warnings calling a reachable store "unreachable" (issue #51's forty-first read, half b).

A real :class:`dashboards.tracking.Tracker` on a real SQLite store.
"""

from __future__ import annotations

import warnings

from mlflow.tracking import MlflowClient

from dashboards.tracking import Tracker
from orchestrator.controller.task_metrics import metric_name

TASK = "a task column's value of a user's data file, long enough that a metric key naming it " * 3


def test_a_key_the_sqlite_store_refuses_drops_its_values_and_the_later_ones_reach_the_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    key = f"exchange/task/{metric_name(TASK)}/all_fail_rate"
    assert len(key) > 250, "MLflow's limit on a metric key (MAX_ENTITY_KEY_LENGTH)"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(uri, "refused", "refused", {"run": {"name": "refused"}}, ["m"], tmp_path / "run")
        tracker.log(1, {key: 0.5, "train/reward_mean": 0.25}, model="m")
        tracker.log(2, {"train/reward_mean": 0.75}, model="m")
        tracker.finish()
    said = [str(w.message) for w in caught]
    assert not [s for s in said if "unreachable" in s], said
    assert any("MLflow refused" in s and "250 characters" in s for s in said), said
    history = MlflowClient(uri).get_metric_history(tracker.child_ids["m"], "train/reward_mean")
    assert [(m.step, m.value) for m in history] == [(2, 0.75)], "the values logged after the refused ones reach the store"
