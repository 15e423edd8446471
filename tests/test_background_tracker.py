"""``tracking.background``: the tracker's writing calls on one thread of the driver, in order
(``dashboards.background``), against a real SQLite MLflow store."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from dashboards.background import BackgroundTracker
from dashboards.tracking import Tracker

DEATH = {"step": 2, "phase": "train", "stage": "train", "actor": "a/trainer0", "kind": "trainer", "action": "retried",
         "time": 1700000000.0}


def feed(tracker, steps: int = 6) -> None:
    """What a short run logs: per-model and pool metrics, the flow matrix, a death and its
    recovery, a resume mark and an artifact, with a dict changed after it was logged."""
    for step in range(1, steps + 1):
        for model in ("a", "b"):
            metrics = {"train/reward_mean": step / 10, f"train/{model}_only": float(step)}
            tracker.log(step, metrics, model=model)
            metrics["train/reward_mean"] = -1.0  # the caller's dict, changed once logged
        tracker.log_flow(step, ["a", "b"], ["a", "b"], np.array([[0, step], [1, 0]]))
        tracker.log(step, {"time/wall": 0.5})
        if step == 3:
            entry = dict(DEATH)
            tracker.log_fault(2, entry, deaths=1)
            entry["recovery_s"] = 4.5  # in place, as a recovery might
            tracker.log_fault(2, entry)
            tracker.mark_resume(2)
    tracker.log_artifact(tracker.flow_path, artifact_path="exchange")


def metric_history(uri: str, run_id: str) -> dict[str, list[tuple[int, float]]]:
    client = MlflowClient(tracking_uri=uri)
    keys = client.get_run(run_id).data.metrics
    return {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in keys}


def test_background_logging_writes_what_the_step_would_in_the_same_order(tmp_path):
    """The same calls through a Tracker and a BackgroundTracker: the same ``metrics.jsonl`` line
    for line, ``faults.jsonl``, ``flow_matrix.json`` and MLflow histories (the death logged as it
    was when logged, before its recovery changed the dict); the calls ran on another thread."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    inline = Tracker(uri, "e", "inline", {"run": {"steps": 6}}, ["a", "b"], tmp_path / "inline")
    feed(inline)
    inline.finish()

    raw = Tracker(uri, "e", "background", {"run": {"steps": 6}}, ["a", "b"], tmp_path / "background")
    threads: set[str] = set()
    log = raw.log
    raw.log = lambda *a, **k: (threads.add(threading.current_thread().name), log(*a, **k))[1]
    background = BackgroundTracker(raw)
    feed(background)
    assert sorted(background.flows) == [1, 2, 3, 4, 5, 6]  # a read waits for the queue
    background.finish()

    assert threads and all(name.startswith("graftpool-tracking") for name in threads)
    for name in ("metrics.jsonl", "faults.jsonl", "flow_matrix.json"):
        ours, theirs = (tmp_path / "background" / name).read_text(), (tmp_path / "inline" / name).read_text()
        if name == "metrics.jsonl":  # the resume mark carries its run name and time
            ours, theirs = ([json.loads(line) for line in text.splitlines()] for text in (ours, theirs))
            for line in (*ours, *theirs):
                line.pop("run_name", None), line.pop("time", None)
        assert ours == theirs, name
    assert '"recovery_s"' not in (tmp_path / "background" / "faults.jsonl").read_text().splitlines()[0]
    for role in [None, "a", "b"]:
        ours = background.parent_id if role is None else background.child_ids[role]
        theirs = inline.parent_id if role is None else inline.child_ids[role]
        assert metric_history(uri, ours) == metric_history(uri, theirs), role
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(background.parent_id).info.status == "FINISHED"
    assert [a.path for a in client.list_artifacts(background.parent_id, "exchange")] == ["exchange/flow_matrix.json"]


def test_a_failed_background_call_is_raised_in_the_callers_thread_and_the_runs_still_end(tmp_path):
    """A queued call that raises (its local file cannot be written) raises at the next call or
    drain, where the run's code can see it, once every queued call has ended (none is left
    running beside the caller); ``finish`` still ends the MLflow runs."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = BackgroundTracker(Tracker(uri, "e", "job", {}, ["a"], tmp_path / "job"))
    tracker.log(1, {"x": 1.0}, model="a")
    tracker.drain()
    (tmp_path / "job" / "metrics.jsonl").unlink()
    (tmp_path / "job" / "metrics.jsonl").mkdir()  # the next append fails
    tracker.log(2, {"x": 2.0}, model="a")
    raw = object.__getattribute__(tracker, "_bg_tracker")
    log_flow = raw.log_flow
    raw.log_flow = lambda *a, **k: (time.sleep(0.3), log_flow(*a, **k))  # still running when log 2 fails
    tracker.log_flow(2, ["a"], ["a"], np.zeros((1, 1)))
    with pytest.raises(IsADirectoryError):
        tracker.drain()
    assert 2 in raw.flows  # drain waited for the call queued after the failed one
    tracker.log(3, {"x": 3.0}, model="a")
    with pytest.raises(IsADirectoryError):
        tracker.finish("FAILED")
    assert MlflowClient(tracking_uri=uri).get_run(tracker.parent_id).info.status == "FAILED"


def test_the_records_mirrored_to_storage_hold_what_the_background_tracker_had_queued(tmp_path):
    """Before each checkpoint's upload the controller mirrors the tracker's records to
    ``run.storage`` (``Controller._mirror_records``); a background tracker's queued writes go to
    ``metrics.jsonl`` first, or the storage's copy lacks the step a resume on a new head needs.
    The tracker's thread is held busy (as by a slow flush) while the mirror is asked for."""
    from types import SimpleNamespace

    from orchestrator.controller.loop import Controller
    from orchestrator.controller.run_storage import RunStorage

    run_dir = tmp_path / "job"
    tracker = BackgroundTracker(Tracker(f"sqlite:///{tmp_path}/mlflow.db", "exp", "job", {"run": {"steps": 1}}, ["a"],
                                        run_dir))
    busy = threading.Event()
    tracker._bg_calls.append(tracker._bg_thread.submit(busy.wait, 30))  # the thread busy before the log
    tracker.log(1, {"train/reward_mean": 0.1}, model="a")
    threading.Timer(0.5, busy.set).start()
    storage = RunStorage(str(tmp_path / "storage"), "job", run_dir)
    Controller._mirror_records(SimpleNamespace(storage=storage, tracker=tracker))
    mirrored = (tmp_path / "storage" / "job" / "metrics.jsonl").read_text().splitlines()
    assert any(json.loads(line).get("step") == 1 for line in mirrored), mirrored
    tracker.finish()
