"""The tracker's warnings when its MLflow store goes out of reach more than once in a job.

A real MLflow tracking server (``python -m dashboards ui``, the command ``make dashboard``
runs) on 127.0.0.1, reached through :class:`tests.netcut.Relay`, whose cable is pulled and put
back twice while a :class:`dashboards.tracking.Tracker` logs. Warnings are filtered as in a
run started without ``-W`` (Python's ``default`` action: a text is shown once per place it is
raised from), not with ``always`` as the other dashboard tests filter them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dashboards.data import load_run
from dashboards.tracking import Tracker
from tests.netcut import Relay, free_port, stop_group, wait_http

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A real MLflow server on a store of its own, on a free loopback port, for the module's tests:
    each logs into an experiment of its own (named after its ``tmp_path``), so none sees another's runs."""
    tmp_path = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    with (tmp_path / "ui.log").open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "dashboards", "ui", "--store", str(tmp_path / "mlflow.db"),
                                 "--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 240, proc)
        yield port
    finally:
        stop_group(proc)


def test_a_second_outage_of_the_store_is_warned_about_and_its_end_too(server, tmp_path):
    """Each outage says that the store is out of reach and, when it is back, that what was
    logged meanwhile was replayed. Before, the second outage's two warnings repeated the first's
    texts word for word (the same error), so Python showed neither: the job's log said the store
    was back and never that it went away again; the values were replayed all the same."""
    relay = Relay(server)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")  # Python's own action for a UserWarning
            tracker = Tracker(f"http://127.0.0.1:{relay.port}", tmp_path.name, "job", {"run": {"steps": 4}}, ["a"],
                              tmp_path / "job", retry_after_s=0)
            for step in (1, 3):
                relay.cut()
                tracker.log(step, {"train/reward_mean": 0.25}, model="a")
                relay.restore()
                tracker.log(step + 1, {"train/reward_mean": 0.75}, model="a")
            tracker.finish()
    finally:
        relay.close()
    messages = [str(w.message) for w in caught]
    assert sum("is unreachable" in m for m in messages) == 2, messages
    assert sum("is reachable again" in m for m in messages) == 2, messages
    history = MlflowClient(tracking_uri=f"http://127.0.0.1:{server}").get_metric_history(
        tracker.child_ids["a"], "train/reward_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.25), (2, 0.75), (3, 0.25), (4, 0.75)]


@contextlib.contextmanager
def _through_relay(server: int) -> Iterator[tuple[Relay, str]]:
    """The MLflow server behind a relay the test can cut, its URI, warnings ignored."""
    relay = Relay(server)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield relay, f"http://127.0.0.1:{relay.port}"
    finally:
        relay.close()


def _checkpoint_record(tracker: Tracker, step: int) -> dict:
    """What ``save_checkpoint`` keeps of the tracker (``orchestrator.controller.checkpoint``)."""
    return {"experiment_id": tracker.experiment_id, "parent_run_id": tracker.parent_id,
            "child_run_ids": dict(tracker.child_ids), "step": step}


def _job(uri: str, folder: Path, steps: int, resume: dict | None = None, experiment: str = "") -> Tracker:
    """A job's tracker for model ``a`` in ``experiment``, by default named after ``folder`` (``resume``:
    the checkpoint's tracking record)."""
    return Tracker(uri, experiment or folder.name, "job", {"run": {"steps": steps}}, ["a"], folder / "job", retry_after_s=0, resume=resume)


def _resumed_to_the_end(uri: str, folder: Path, record: dict, last: int, experiment: str = "") -> Tracker:
    """A job resumed from ``record`` that logs its last step (``last / 10``) and ends."""
    resumed = _job(uri, folder, last, resume=record, experiment=experiment)
    resumed.log(last, {"train/reward_mean": last / 10}, model="a")
    resumed.finish()
    return resumed


def _by_step(port: int, run_id: str) -> dict[int, float]:
    history = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}").get_metric_history(run_id, "train/reward_mean")
    return {m.step: m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))}


@pytest.mark.parametrize("reached", [True, False], ids=["store-lost-mid-job", "store-never-reached"])
def test_a_job_killed_while_its_store_was_out_of_reach_resumes_with_the_values_it_had_not_sent(
        server, tmp_path, reached):
    """A job logs while its store is out of reach (after step 1, or from its start), is killed
    after its checkpoint at step 3 (no ``finish``), and is resumed with the store back. Before,
    the resumed job reopened the runs (or made new ones) and went on from step 4: steps 2-3 (1-3)
    were in ``metrics.jsonl`` only, and MLflow and the reports read from it had a silent gap."""
    with _through_relay(server) as (relay, uri):
        if not reached:
            relay.cut()
        killed = _job(uri, tmp_path, 4)
        for step in (1, 2, 3):
            killed.log(step, {"train/reward_mean": step / 10}, model="a")
            relay.cut()
        record = _checkpoint_record(killed, 3)
        relay.restore()
        resumed = _resumed_to_the_end(uri, tmp_path, record, 4)
    assert (record["parent_run_id"] is not None) == reached
    assert _by_step(server, resumed.child_ids["a"]) == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}


def test_a_death_logged_while_the_store_was_out_of_reach_reaches_it_when_the_killed_job_is_resumed(server, tmp_path):
    """The reports read a job's deaths from its run's ``graftpool.fault.<ms>`` tags. Before, a death
    logged while the store was out of reach, the job then killed, was in ``faults.jsonl`` only."""
    entry = {"step": 2, "phase": "train", "stage": "train", "actor": "a/trainer/0", "kind": "trainer",
             "action": "restarted", "time": 1700000000.25}
    with _through_relay(server) as (relay, uri):
        killed = _job(uri, tmp_path, 4)
        killed.log(1, {"train/reward_mean": 0.1}, model="a")
        relay.cut()
        killed.log_fault(2, entry, deaths=1)
        killed.log(2, {"train/reward_mean": 0.2}, model="a")
        record = _checkpoint_record(killed, 2)
        relay.restore()
        resumed = _job(uri, tmp_path, 4, resume=record)
        resumed.finish()
    tags = MlflowClient(tracking_uri=f"http://127.0.0.1:{server}").get_run(resumed.parent_id).data.tags
    assert json.loads(tags["graftpool.fault.1700000000250"]) == entry


def test_a_job_resumed_twice_sends_what_the_middle_job_never_could(server, tmp_path):
    """The store is out of reach from step 2 to the end of a second job: the first job is killed
    after its checkpoint at step 3, the second (resumed from it, the store still out of reach) after
    its checkpoint at step 5, the third resumed with the store back. Before, the second job deleted
    ``mlflow.json`` at its start and never reached its store to write it again, so the third found
    no ``caught_up_step`` and sent nothing of steps 2-5: they were in ``metrics.jsonl`` only."""
    with _through_relay(server) as (relay, uri):
        first = _job(uri, tmp_path, 6)
        first.log(1, {"train/reward_mean": 0.1}, model="a")
        relay.cut()
        for step in (2, 3):
            first.log(step, {"train/reward_mean": step / 10}, model="a")
        second = _job(uri, tmp_path, 6, resume=_checkpoint_record(first, 3))
        for step in (4, 5):
            second.log(step, {"train/reward_mean": step / 10}, model="a")
        relay.restore()
        third = _resumed_to_the_end(uri, tmp_path, _checkpoint_record(second, 5), 6)
    assert _by_step(server, third.child_ids["a"]) == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4, 5: 0.5, 6: 0.6}


def test_steps_logged_again_after_an_in_process_recovery_reach_the_store_after_a_resume(server, tmp_path):
    """A trainer death sends the job back to its checkpoint at step 1 (``mark_resume``) after the
    store had every value to step 3; the store goes out of reach, steps 2-3 are logged again (new
    values) and checkpointed, and the job is killed. Before, ``caught_up_step`` stayed 3, so the
    resumed job sent step 3 only: MLflow kept step 2's value from before the recovery, which
    ``metrics.jsonl`` (and the model the checkpoint holds) had superseded."""
    with _through_relay(server) as (relay, uri):
        killed = _job(uri, tmp_path, 4)
        for step in (1, 2, 3):
            killed.log(step, {"train/reward_mean": step / 10}, model="a")
        killed.mark_resume(1)
        relay.cut()
        for step in (2, 3):
            killed.log(step, {"train/reward_mean": step / 10 + 0.05}, model="a")
        record = _checkpoint_record(killed, 3)
        relay.restore()
        resumed = _resumed_to_the_end(uri, tmp_path, record, 4)
    assert _by_step(server, resumed.child_ids["a"]) == {1: 0.1, 2: 0.25, 3: 0.35, 4: 0.4}


def test_a_job_that_reached_its_store_after_its_checkpoint_is_resumed_into_the_same_runs(server, tmp_path):
    """The store is out of reach from the job's start to past its checkpoint at step 2, so the
    checkpoint names no MLflow runs; the job reaches the store at step 3 (its runs made, steps 1-3
    sent) and is killed. Before, the resumed job made a second job run of the same name beside the
    first, which stayed RUNNING with step 3's superseded value; now it logs into the runs the
    killed job made (``mlflow.json``'s), and ends them (issue #51's twenty-ninth read)."""
    relay = Relay(server)
    uri = f"http://127.0.0.1:{relay.port}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            relay.cut()
            killed = Tracker(uri, tmp_path.name, "job", {"run": {"steps": 4}}, ["a"], tmp_path / "job", retry_after_s=0)
            for step in (1, 2):
                killed.log(step, {"train/reward_mean": step / 10}, model="a")
            record = _checkpoint_record(killed, 2)
            assert record["parent_run_id"] is None
            relay.restore()
            killed.log(3, {"train/reward_mean": 0.3}, model="a")
            assert killed.parent_id is not None
            resumed = Tracker(uri, tmp_path.name, "job", {"run": {"steps": 4}}, ["a"], tmp_path / "job", retry_after_s=0,
                              resume=record)
            for step in (3, 4):
                resumed.log(step, {"train/reward_mean": step / 10 + 0.05}, model="a")
            resumed.finish()
    finally:
        relay.close()
    client = MlflowClient(tracking_uri=f"http://127.0.0.1:{server}")
    jobs = client.search_runs([resumed.experiment_id], "tags.`graftpool.role` = 'job'")
    assert [(run.info.run_id, run.info.status) for run in jobs] == [(killed.parent_id, "FINISHED")]
    assert _by_step(server, resumed.child_ids["a"]) == {1: 0.1, 2: 0.2, 3: 0.35, 4: 0.45}


def test_a_report_of_a_run_whose_store_was_out_of_reach_at_its_end_reads_every_step(server, tmp_path):
    """A job whose store went out of reach after step 2 and stayed so to its end (its last warning:
    values only in ``metrics.jsonl``; ``caught_up_step`` 2). Before, ``dashboards report`` and
    ``compare`` of its run folder read the MLflow runs, which answered, and showed a 4-step run as
    2 steps, with no note; now they read the folder's log, with a note naming the step MLflow holds."""
    with _through_relay(server) as (relay, uri):
        job = _job(uri, tmp_path, 4)
        for step in (1, 2, 3, 4):
            if step == 3:
                relay.cut()
            job.log(step, {"train/reward_mean": step / 10}, model="a")
        job.finish()
    assert json.loads((tmp_path / "job" / "mlflow.json").read_text())["caught_up_step"] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = load_run(str(tmp_path / "job"), f"http://127.0.0.1:{server}")
    assert data.metric("a", "train/reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert any("up to 2 only" in note for note in data.notes), data.notes


def _dropped_then_back(tmp_path: Path, monkeypatch, back: bool = True) -> tuple[list[str], object]:
    """A tracker whose real SQLite store is out of reach (a file stands where its folder goes) for
    steps 1-3 with ``MAX_PENDING`` lowered to 3 (200,000 in a job), so the oldest values are dropped,
    then (``back``) reachable for step 4, else still out of reach at the end; returns the warnings'
    texts and ``load_run`` of the run folder (None when not ``back``)."""
    import dashboards.tracking as tracking

    monkeypatch.setattr(tracking, "MAX_PENDING", 3)
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's folder goes")
    data = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(f"sqlite:///{blocker}/mlflow.db", "exp", "job", {"run": {"steps": 4 if back else 3}},
                          ["a"], tmp_path / "job", retry_after_s=0)
        for step in (1, 2, 3):
            tracker.log(step, {"train/reward_mean": step / 10, "train/loss": 1.0}, model="a")
        if back:
            blocker.unlink()  # the store is back
            tracker.log(4, {"train/reward_mean": 0.4}, model="a")
        tracker.finish()
        if back:
            data = load_run(str(tmp_path / "job"))
    return [str(w.message) for w in caught], data


def test_values_dropped_while_the_store_was_out_of_reach_send_the_report_to_the_metric_log(tmp_path, monkeypatch):
    """More than ``MAX_PENDING`` values waiting for an unreachable store drops the oldest; the store,
    back, then got the rest and ``caught_up_step`` the last step, so ``dashboards report`` read the
    MLflow runs, which lack the dropped steps, with no note (issue #51's thirty-eighth read, half b)."""
    messages, data = _dropped_then_back(tmp_path, monkeypatch)
    assert data.series["a"]["train/reward_mean"] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert json.loads((tmp_path / "job" / "mlflow.json").read_text())["caught_up_step"] == 0
    assert any("the values from step 1 are only in" in m for m in messages)
    assert any("metrics.jsonl" in note for note in data.notes)


def test_a_job_resumed_from_storage_on_a_new_head_sends_what_the_killed_job_had_not(server, tmp_path):
    """The killed job (its head's folder ``head1``) sent step 1, then its store went out of reach
    for steps 2-3; its checkpoint of step 3 reached ``run.storage`` (``RunStorage.catch_up``: the
    records, then the checkpoint). A job on a new head (``head2``: no shared disk, the folder empty)
    downloads them (``open_storage``) and resumes with the store back. Before, ``mlflow.json`` was
    not among the records, so the resumed job did not know what its store lacked and sent only
    step 4: MLflow, and the reports read from it, had a silent gap at steps 2-3 (issue #51's
    thirty-ninth read, half a)."""
    from orchestrator.controller.run_storage import RunStorage, open_storage

    with _through_relay(server) as (relay, uri):
        killed = _job(uri, tmp_path / "head1", 4, experiment=tmp_path.name)
        killed.log(1, {"train/reward_mean": 0.1}, model="a")
        relay.cut()
        for step in (2, 3):
            killed.log(step, {"train/reward_mean": step / 10}, model="a")
        record = _checkpoint_record(killed, 3)
        checkpoint = tmp_path / "head1" / "job" / "checkpoints" / "step_000003"
        (checkpoint / "a").mkdir(parents=True)  # a model's files in its folder, as a checkpoint holds them
        (checkpoint / "a" / "generation_rng.pt").write_bytes(b"rng")
        (checkpoint / "controller.json").write_text(json.dumps({"step": 3, "tracking": record}))
        storage = tmp_path / "storage"
        assert RunStorage(str(storage), "job", tmp_path / "head1" / "job").catch_up(checkpoint, 3, 2)
        open_storage(str(storage), tmp_path / "head2" / "job", resume=True)
        relay.restore()
        resumed = _resumed_to_the_end(uri, tmp_path / "head2", record, 4, experiment=tmp_path.name)
    assert _by_step(server, resumed.child_ids["a"]) == {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}


def test_the_store_back_after_dropped_values_does_not_say_all_were_replayed(tmp_path, monkeypatch):
    """The warning that the store is reachable again said "the values logged while it was down have
    been replayed" after the oldest of them had been dropped (issue #51's thirty-ninth read, half b):
    the job's last word on the outage contradicted the drop's warning. It names the dropped values."""
    messages, _ = _dropped_then_back(tmp_path, monkeypatch)
    back = [m for m in messages if "is reachable again" in m]
    assert back, messages
    assert "dropped unsent" in back[-1] and "step 1" in back[-1] and "metrics.jsonl" in back[-1], back[-1]


def test_the_end_of_job_count_of_unsent_values_includes_those_dropped(tmp_path, monkeypatch):
    """A store still out of reach at the end: the last warning counted the values waiting
    (``MAX_PENDING``, lowered to 3 here), not those dropped past the cap, though both are only in
    ``metrics.jsonl`` (issue #51's thirty-ninth read, half b): 3 said where 6 were."""
    messages, _ = _dropped_then_back(tmp_path, monkeypatch, back=False)
    end = [m for m in messages if "unreachable at the end of the run" in m]
    assert end and "6 metric values are only in" in end[-1], end
