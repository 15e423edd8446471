"""Dashboards without Ray: the complementarity matrix on a real Parquet store, the flow
matrix from metric series, metrics.jsonl segments, the plots, the tracker against a real
sqlite MLflow store and against a port where nothing listens, and new sqlite stores
(the tracked jobs read back from MLflow: test_dashboards_store.py)."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from dashboards import plots
from dashboards.data import (
    POOL,
    complementarity,
    from_history,
    read_metrics_jsonl,
)
from dashboards.mlflow_basics import quick_http
from dashboards.tracking import Tracker
from orchestrator.controller.trajectory_store import TrajectoryStore
from tests.netcut import free_port
from tests.tracking_resume import killed_then_resumed_on_a_new_head, metric_history

MODELS = ["a", "b", "c"]


def _own(step, model, prompt, rewards):
    return [dict(step=step, model=model, prompt_id=prompt, task="add", sample=i, response="x", n_tokens=1,
                 reward=float(r), reason="", advantage=0.0, source_model=model, kind="own", weight=1.0,
                 compat=None, mean_logp=None, trained=True, policy_version=step - 1)
            for i, r in enumerate(rewards)]


def test_complementarity_counts_all_fail_prompts_the_other_model_solves(tmp_path):
    store = TrajectoryStore(tmp_path / "trajectories")
    # step 1: p1 a fails, b 1/2, c fails; p2 a fails, b fails, c 2/2; p3 everyone solves something
    rows = (_own(1, "a", "p1", [0, 0]) + _own(1, "b", "p1", [1, 0]) + _own(1, "c", "p1", [0, 0])
            + _own(1, "a", "p2", [0, 0]) + _own(1, "b", "p2", [0, 0]) + _own(1, "c", "p2", [1, 1])
            + _own(1, "a", "p3", [1, 0]) + _own(1, "b", "p3", [0, 1]) + _own(1, "c", "p3", [1, 0]))
    # a graft row under b must not count as b's own success
    graft = _own(1, "b", "p2", [1, 1])
    for r in graft:
        r.update(kind="graft", source_model="c")
    store.write_step(1, rows + graft)
    # step 2, same prompt id p1 again: a fails, b fails, c solves
    store.write_step(2, _own(2, "a", "p1", [0, 0]) + _own(2, "b", "p1", [0, 0]) + _own(2, "c", "p1", [0, 1]))
    comp = complementarity(tmp_path / "trajectories", MODELS)
    assert comp["models"] == MODELS
    # all-fail groups: a {(1,p1),(1,p2),(2,p1)}, b {(1,p2),(2,p1)}, c {(1,p1)}
    assert comp["all_fail"] == [3, 2, 1]
    assert comp["solved"] == [[0, 1, 2], [0, 0, 2], [0, 1, 0]]
    assert comp["C"][0] == [None, pytest.approx(1 / 3), pytest.approx(2 / 3)]
    assert comp["C"][1] == [pytest.approx(0.0), None, pytest.approx(1.0)]
    assert comp["C"][2] == [pytest.approx(0.0), pytest.approx(1.0), None]
    assert complementarity(tmp_path / "nothing") is None


def _history(steps: int = 4) -> tuple[list[dict], list[dict]]:
    """Synthetic controller history: b receives from a and from a stored donor, a from b."""
    history, evals = [], []
    for s in range(1, steps + 1):
        models = {
            "a": {"train/reward_mean": 0.1 * s, "exchange/rate": 0.5, "exchange/all_fail_rate": 0.25,
                  "exchange/received": 1.0, "exchange/given": 2.0, "exchange/from/b": 1.0,
                  "gate/admission_rate": 0.75, "gate/mean_s": 0.9, "gate/mean_w": 0.8,
                  "train/own_clip_frac": 0.01, "train/peer_clip_frac": 0.02},
            "b": {"train/reward_mean": 0.2, "exchange/rate": float("nan"), "exchange/all_fail_rate": 0.0,
                  "exchange/received": float(s), "exchange/given": 1.0, "exchange/from/a": 2.0,
                  "exchange/from/a@store": float(s - 2) if s > 2 else 0.0, "gate/admission_rate": 1.0},
        }
        history.append({"step": s, "timings": {"generate": 1.0, "train": 0.5}, "models": models})
        if s % 2 == 0:
            evals.append({"step": s, "scores": {"a": {"add": 0.1 * s, "avg": 0.1 * s},
                                                "b": {"add": 0.5, "avg": 0.5}}})
    return history, evals


def test_flow_matrix_and_series_from_the_controller_history():
    history, evals = _history()
    data = from_history("job", ["a", "b"], history, evals)
    assert data.donors() == ["a", "b", "a_store"]  # '@' is not MLflow-safe
    assert data.steps() == [1, 2, 3, 4]
    np.testing.assert_array_equal(data.flow(), [[0, 8], [4, 0], [0, 3]])
    np.testing.assert_array_equal(data.flow(3, 4), [[0, 4], [2, 0], [0, 3]])
    assert data.metric("b", "exchange/rate") == []  # NaN values are left out
    assert data.metric("a", "eval/add/pass_at_1") == [(2, pytest.approx(0.2)), (4, pytest.approx(0.4))]
    assert data.eval_sets() == ["add", "avg"]
    assert data.metric(POOL, "time/step") == [(s, 1.5) for s in range(1, 5)]


def test_metrics_jsonl_restart_supersedes_later_steps_and_resume_keeps_earlier(tmp_path):
    lines = [{"event": "start"}, *({"step": s, "model": "a", "metrics": {"x": float(s)}} for s in (1, 2, 3)),
             {"event": "start"}, {"step": 3, "model": "a", "metrics": {"x": 30.0}},  # resumed at 3
             {"step": 3, "model": None, "metrics": {"time/step": 1.0}}]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    series = read_metrics_jsonl(path)
    assert series["a"]["x"] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert series[POOL]["time/step"] == [(3, 1.0)]
    with path.open("a") as f:  # a fresh run under the same folder starts at step 1 again
        f.write(json.dumps({"event": "start"}) + "\n")
        f.write(json.dumps({"step": 1, "model": "a", "metrics": {"x": 100.0}}) + "\n")
    assert read_metrics_jsonl(path)["a"]["x"] == [(1, 100.0)]


def test_plots_annotate_the_flow_and_complementarity_and_render_png():
    flow = np.array([[0, 7], [3, 0]])
    fig = plots.flow_heatmap(["a", "b"], ["a", "b"], [("steps 1-2", flow), ("all", flow * 2)])
    texts = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert {"7", "3", "14", "6"} <= texts and "0" not in texts  # the diagonal is blank
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == ["steps 1-2", "all"]
    comp = {"models": ["a", "b"], "all_fail": [4, 0], "solved": [[0, 1], [0, 0]], "C": [[None, 0.25], [None, None]]}
    fig = plots.complementarity_heatmap(comp)
    assert {t.get_text() for t in fig.axes[0].texts} == {"0.25\n(1/4)", "-"}
    series = {"a": {"exchange/rate": [(1, 0.5), (2, float("nan")), (3, 1.0)], "exchange/all_fail_rate": [(1, 0.2)]}}
    fig = plots.rate_curves(series)
    assert list(fig.axes[0].lines[0].get_xdata()) == [1, 3]
    png = plots.png_bytes(plots.eval_curves({"a": {"eval/add/pass_at_1": [(2, 0.5)]}}, ["add"]))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_exchange_rate_panel_holds_rates_above_one():
    """Issue #51's forty-seventh read: ``exchange/rate`` is the groups received (SGT: responses) over
    the all-fail groups (docs/metrics.md), 2 where a learner of three HACPO models takes both peers'
    groups on each all-fail prompt, or SGT with ``count: 2`` two responses; the panel's range was
    fixed at [-0.02, 1.02], so ``plots/exchange_rates.png`` cut those points off."""
    series = {"a": {"exchange/rate": [(1, 0.5), (2, 2.0)], "exchange/all_fail_rate": [(1, 0.25)]},
              "b": {"exchange/rate": [(1, 1.5)]}}
    fig = plots.rate_curves(series)
    low, high = fig.axes[0].get_ylim()
    assert low <= 0 and high >= 2.0, (low, high)
    assert fig.axes[1].get_ylim() == pytest.approx((-0.02, 1.02))  # a panel within [0, 1] keeps its range


def test_tracker_with_nothing_listening_is_fast_warns_once_and_keeps_metrics_locally(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a", "b"], tmp_path, retry_after_s=0)
        for step in range(1, 21):  # retry_after_s=0: every call tries the server again
            tracker.log(step, {"train/reward_mean": 0.5, "eval/add/pass@1": 1.0}, model="a")
            tracker.log(step, {"exchange/flow/a/b": 1.0})
            tracker.log_flow(step, ["a", "b"], ["a", "b"], np.array([[0, 1], [2, 0]]))
        tracker.finish()
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"60 failing calls took {elapsed:.1f}s"
    messages = [str(w.message) for w in caught]
    assert sum("is unreachable" in m for m in messages) == 1, messages
    assert any("only in" in m for m in messages)  # the end says what did not reach MLflow
    assert not tracker.ok and tracker.parent_id is None
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["event"] == "start"
    assert len(records) == 41 and records[1]["metrics"] == {"train/reward_mean": 0.5, "eval/add/pass_1": 1.0}
    flows = json.loads((tmp_path / "flow_matrix.json").read_text())["steps"]
    assert [f["step"] for f in flows] == list(range(1, 21)) and flows[0]["F"] == [[0, 1], [2, 0]]
    assert not (tmp_path / "mlflow.json").exists()


def test_a_secondary_run_in_a_job_folder_keeps_its_own_local_files(tmp_path):
    """The eval command logs ``<name>-eval`` from the job's folder ``<name>/``."""
    folder = tmp_path / "demo"
    uri = f"http://127.0.0.1:{free_port()}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Tracker(uri, "e", "demo", {}, ["a"], folder).log(1, {"x": 1.0}, model="a")
        Tracker(uri, "e", "demo-eval", {}, ["a"], folder).log(1, {"y": 2.0}, model="a")
    assert read_metrics_jsonl(folder / "metrics.jsonl")["a"] == {"x": [(1, 1.0)]}
    assert read_metrics_jsonl(folder / "metrics.eval.jsonl")["a"] == {"y": [(1, 2.0)]}


def test_quick_http_leaves_user_settings_alone(monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "77")
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    import os

    with quick_http(3):
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "77"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_a_new_sqlite_store_is_a_copy_of_mlflows_own_empty_store(tmp_path):
    """``dashboards.sqlite_store``: the first new store makes the template (MLflow's own
    migrations), later ones copy it; a copy has the schema and experiments of a store MLflow
    makes itself, takes runs, and an existing store or another URI is left alone."""
    import sqlite3

    from dashboards.sqlite_store import seed_sqlite_store, template_path

    cache = tmp_path / "cache"

    def schema(db: Path) -> tuple:
        """Tables' columns, indexes, the migration head and the experiments (not the DDL text:
        MLflow's own stores differ in it, as its table rebuilds happened to run)."""
        with sqlite3.connect(db) as con:
            names = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
            columns = {t: sorted(r[1:] for r in con.execute(f'pragma table_info("{t}")')) for t in names}
            indexes = sorted(r[0] for r in con.execute("select name from sqlite_master where type = 'index'"))
            return columns, indexes, con.execute("select version_num from alembic_version").fetchall(), \
                con.execute("select experiment_id, name, lifecycle_stage from experiments").fetchall()

    made = tmp_path / "mlflow_made.db"
    MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()
    first, second = tmp_path / "a" / "mlflow.db", tmp_path / "b" / "mlflow.db"
    assert seed_sqlite_store(f"sqlite:///{first}", cache) and template_path(cache).is_file()
    assert seed_sqlite_store(f"sqlite:///{second}", cache)
    assert schema(first) == schema(second) == schema(made)
    client = MlflowClient(tracking_uri=f"sqlite:///{second}")
    run = client.create_run(client.create_experiment("x")).info.run_id
    client.log_metric(run, "m", 1.0)
    before = second.read_bytes()
    assert not seed_sqlite_store(f"sqlite:///{second}", cache) and second.read_bytes() == before
    assert not seed_sqlite_store("http://127.0.0.1:9", cache) and not seed_sqlite_store("sqlite:///:memory:", cache)
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_resumed_job_with_a_fresh_sqlite_store_logs_into_new_runs(tmp_path):
    """A job resubmitted with ``--resume`` in a fresh working copy (``run.output_dir`` relative,
    the checkpoint from ``run.storage``, ``make rehearsal``) carries the MLflow run ids of the
    killed job, whose ``mlflow.db`` stayed behind: the new default SQLite store has no such run
    (nor the killed job's experiment id, 1: a new store holds only experiment 0).
    MLflow's SQL store says so with an MlflowException (RESOURCE_DOES_NOT_EXIST), not a
    RestException: the job logs into new runs, instead of calling the store unreachable for
    the whole run and keeping every metric only in metrics.jsonl."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    resume = {"experiment_id": "1", "parent_run_id": "0" * 32, "child_run_ids": {"a": "1" * 32}, "step": 1}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a"], tmp_path / "job", resume=resume)
        tracker.log(2, {"train/reward_mean": 0.5}, model="a")
        tracker.finish()
    messages = [str(w.message) for w in caught]
    assert any(f"MLflow has no run {'0' * 32} to resume" in m for m in messages), messages
    assert not any("unreachable" in m for m in messages), messages
    assert tracker.ok and tracker.parent_id not in (None, "0" * 32)
    history = MlflowClient(tracking_uri=uri).get_metric_history(tracker.child_ids["a"], "train/reward_mean")
    assert [(m.step, m.value) for m in history] == [(2, 0.5)]


def test_a_job_resumed_into_a_new_store_replays_the_metric_log_up_to_its_checkpoint(tmp_path):
    """Issue #51's thirteenth read: a job resumed from ``run.storage`` on a new head gets the run
    folder's ``metrics.jsonl`` with the checkpoint, but its SQLite store is new, so it logged into
    new runs from the resumed step on: MLflow (and ``dashboards report``, which reads it while it is
    reachable) showed none of the steps before. The new runs get the log's values up to the
    checkpoint's step; a value logged past it (superseded by the resume) is not replayed."""
    old = Tracker(f"sqlite:///{tmp_path / 'lost-head.db'}", "exp", "job", {"run": {"steps": 3}}, ["a"],
                  tmp_path / "job")
    for step in (1, 2, 3):
        old.log(step, {"train/reward_mean": step / 10}, model="a")
        old.log(step, {"time/wall": float(step)})
    ids = {"experiment_id": old.experiment_id, "parent_run_id": old.parent_id,
           "child_run_ids": dict(old.child_ids), "step": 2}  # the step-2 checkpoint's
    old.finish("KILLED")

    uri = f"sqlite:///{tmp_path / 'new-head.db'}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        new = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a"], tmp_path / "job", resume=ids)
        new.log(3, {"train/reward_mean": 0.35}, model="a")
        new.finish()
    client = MlflowClient(tracking_uri=uri)
    history = client.get_metric_history(new.child_ids["a"], "train/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.35)]
    assert sorted(m.step for m in client.get_metric_history(new.parent_id, "time/wall")) == [1, 2]


def test_a_job_resumed_from_a_metric_log_cut_short_replays_it_into_mlflow(tmp_path):
    """Issue #51's sixteenth read: a checkpoint copies ``metrics.jsonl`` to a path ``run.storage``
    in place, so a job stopped during the copy leaves its last line cut short there. The job
    resumed from that storage on a new head appended its ``start`` line to the fragment, the
    replay into its new MLflow runs failed on the joined line (``JSONDecodeError``, taken for an
    unreachable store for the whole run) and so did every later read of the log. The fragment
    (a step past the checkpoint) is dropped, with a warning, before anything is appended."""
    from dashboards.metric_log import read_metrics_jsonl

    old = Tracker(f"sqlite:///{tmp_path / 'lost-head.db'}", "exp", "job", {"run": {"steps": 3}}, ["a"],
                  tmp_path / "job")
    for step in (1, 2, 3):
        old.log(step, {"train/reward_mean": step / 10}, model="a")
    ids = {"experiment_id": old.experiment_id, "parent_run_id": old.parent_id,
           "child_run_ids": dict(old.child_ids), "step": 2}  # the step-2 checkpoint's
    old.finish("KILLED")
    log = tmp_path / "job" / "metrics.jsonl"
    log.write_bytes(log.read_bytes()[:-20])  # step 3's line cut short, as a copy stopped part-way

    uri = f"sqlite:///{tmp_path / 'new-head.db'}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        new = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a"], tmp_path / "job", resume=ids)
        new.log(3, {"train/reward_mean": 0.35}, model="a")
        new.finish()
    assert new.ok, [str(w.message) for w in caught]
    assert any("cut short" in str(w.message) for w in caught)
    history = MlflowClient(tracking_uri=uri).get_metric_history(new.child_ids["a"], "train/reward_mean")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.1), (2, 0.2), (3, 0.35)]
    assert read_metrics_jsonl(log)["a"]["train/reward_mean"] == [(1, 0.1), (2, 0.2), (3, 0.35)]


def test_a_job_resumed_into_a_new_store_replays_every_death_at_one_step(tmp_path):
    """A node lost takes a trainer rank and a replica at one step: two deaths, each with its
    ``faults/deaths`` count and ``faults/recovery_s`` (docs/metrics.md: one value per death, several
    at one step). The metric log read one value per key and step, so a job resumed on a new head
    (run.storage, a new MLflow store) replayed the last death's values only."""
    old = Tracker(f"sqlite:///{tmp_path / 'lost-head.db'}", "exp", "job", {"run": {"steps": 3}}, ["a"],
                  tmp_path / "job")
    deaths = [{"step": 1, "phase": "step 1", "stage": "train", "actor": f"a/{who}", "kind": kind,
               "action": "restarted", "time": 1000.0 + i} for i, (who, kind) in
              enumerate([("trainer_0", "trainer"), ("replica_0", "generator")])]
    for count, entry in enumerate(deaths, 1):
        old.log_fault(1, entry, deaths=count)
    for entry, took in zip(deaths, (4.5, 7.25), strict=True):
        old.log_fault(1, {**entry, "recovery_s": took})
    old.log(1, {"train/reward_mean": 0.1}, model="a")
    new = killed_then_resumed_on_a_new_head(old, 1, {"run": {"steps": 3}}, tmp_path, "KILLED")
    def history(key: str) -> list[tuple[int, float]]:
        return metric_history(new, new.parent_id, key)
    assert history("faults/recovery_s") == [(1, 4.5), (1, 7.25)]
    assert history("faults/deaths") == [(1, 1.0), (1, 2.0)]
    assert history("faults/trainer") == [(1, 1.0)] and history("faults/generator") == [(1, 1.0)]


def test_a_death_that_sent_the_job_back_a_step_is_replayed_into_a_new_store(tmp_path):
    """A trainer rank lost at step 3 sends the job back to step 2 (its snapshot): the metric log's
    start line supersedes what was logged past step 2, and with it the death's ``faults/trainer``
    and ``faults/deaths``, so a job later resumed into a new store (a new head) replayed its
    recovery time alone; the death stays on record, as in ``faults.jsonl`` and its tag."""
    old = Tracker(f"sqlite:///{tmp_path / 'lost-head.db'}", "exp", "job", {"run": {"steps": 4}}, ["a"],
                  tmp_path / "job")
    for step in (1, 2, 3):
        old.log(step, {"train/reward_mean": step / 10}, model="a")
    death = {"step": 3, "phase": "step 3", "stage": "train", "actor": "a/trainer_0", "kind": "trainer",
             "action": "back to step 2", "time": 1000.0}
    old.log_fault(3, death, deaths=1)
    old.mark_resume(2)
    old.log_fault(3, {**death, "recovery_s": 6.5})
    for step in (3, 4):
        old.log(step, {"train/reward_mean": step / 10 + 0.05}, model="a")
    new = killed_then_resumed_on_a_new_head(old, 4, {"run": {"steps": 4}}, tmp_path, "KILLED")
    def history(run_id: str, key: str) -> list[tuple[int, float]]:
        return metric_history(new, run_id, key)
    assert history(new.parent_id, "faults/trainer") == [(3, 1.0)]
    assert history(new.parent_id, "faults/deaths") == [(3, 1.0)]
    assert history(new.parent_id, "faults/recovery_s") == [(3, 6.5)]
    assert history(new.child_ids["a"], "train/reward_mean") == [(1, 0.1), (2, 0.2), (3, 0.35), (4, 0.45)]
