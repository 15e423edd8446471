"""Dashboards without Ray: the complementarity matrix on a real Parquet store, the flow
matrix from metric series, metrics.jsonl segments, the plots, the tracker against a real
sqlite MLflow store and against a port where nothing listens, the views hook, the HTML
report and comparison read back from MLflow, and the `ui` command line."""

from __future__ import annotations

import base64
import json
import re
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from dashboards import plots
from dashboards.__main__ import _experiment_id, build_parser, main, ui_banner, ui_command
from dashboards.data import (
    POOL,
    complementarity,
    from_history,
    load_run,
    read_metrics_jsonl,
)
from dashboards.report import render_compare, render_report
from dashboards.tracking import Tracker, quick_http
from dashboards.views import VIEW_FILES, log_views
from orchestrator.controller.trajectory_store import TrajectoryStore
from tests.netcut import free_port

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


# an actor death and its recovery, as orchestrator.controller.faults logs them (the graft job
# has it at step 2)
DEATH = {"step": 2, "phase": "step 2", "stage": "train", "actor": "trainer rank 1 of model b", "kind": "trainer",
         "action": "restarted model b's trainers and went back to checkpoint step_000001", "time": 1_700_000_000.25}


def _tracked_job(out: Path, name: str, history, evals, exchange: str = "graft") -> tuple[Tracker, Path]:
    """A job logged the way the controller logs it, to a sqlite store under ``out``."""
    uri = f"sqlite:///{out / 'mlflow.db'}"
    run_dir = out / name
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(f"run:\n  name: {name}\nexchange:\n  name: {exchange}\n")
    tracker = Tracker(uri, "graftpool", name, {"exchange": {"name": exchange}, "algorithm": {"prompt_batch": 4}},
                      ["a", "b"], run_dir)
    tracker.log_artifact(run_dir / "config.yaml")
    store = TrajectoryStore(run_dir / "trajectories")
    for entry in history:
        s = entry["step"]
        store.write_step(s, _own(s, "a", "p1", [0, 0]) + _own(s, "b", "p1", [1, 0]))
        for model, metrics in entry["models"].items():
            tracker.log(s, metrics, model=model)
        tracker.log_flow(s, ["a", "b", "a@store"], ["a", "b"],
                         np.array([[0, entry["models"]["b"]["exchange/from/a"]], [1, 0], [0, 0]]))
        tracker.log(s, {"exchange/flow/a/b": entry["models"]["b"]["exchange/from/a"], "time/step": 1.5})
        if s == DEATH["step"] and exchange == "graft":
            tracker.log_fault(s, DEATH, deaths=1)
            tracker.log_fault(s, {**DEATH, "recovery_s": 4.5})
        for e in evals:
            if e["step"] == s:
                for model, scores in e["scores"].items():
                    tracker.log(s, {f"eval/{k}/pass_at_1": v for k, v in scores.items()}, model=model)
                log_views(tracker, [h for h in history if h["step"] <= s], [e2 for e2 in evals if e2["step"] <= s],
                          store.folder, s, window=2)
    log_views(tracker, history, evals, store.folder, history[-1]["step"], window=2)
    tracker.finish()
    return tracker, run_dir


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Two jobs in one sqlite store: GRAFT-like (groups move) and GRPO-like (nothing moves)."""
    out = tmp_path_factory.mktemp("store")
    history, evals = _history()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        graft = _tracked_job(out, "graft-run", history, evals)
    grpo_history = [{**h, "models": {m: {**v, "exchange/received": 0.0, "exchange/from/a": 0.0,
                                           "exchange/from/b": 0.0, "exchange/from/a@store": 0.0}
                                     for m, v in h["models"].items()}} for h in history]
    grpo = _tracked_job(out, "grpo-run", grpo_history, evals, exchange="none")
    return {"out": out, "uri": f"sqlite:///{out / 'mlflow.db'}", "graft": graft, "grpo": grpo,
            "warnings": [str(w.message) for w in caught
                         if "dashboards" in w.filename or "MLflow" in str(w.message)]}


def test_tracker_logs_parent_children_flow_and_views_to_a_real_store(jobs):
    tmp_path = jobs["out"]
    tracker, run_dir = jobs["graft"]
    assert not jobs["warnings"]  # nothing of ours may go wrong on a healthy store
    client = MlflowClient(tracking_uri=jobs["uri"])
    parent = client.get_run(tracker.parent_id)
    assert parent.info.status == "FINISHED" and parent.data.params["exchange.name"] == "graft"
    assert parent.info.artifact_uri.startswith((tmp_path / "mlartifacts").as_uri())  # not ./mlruns of the cwd
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {c.data.tags["graftpool.model"] for c in children} == {"a", "b"}
    b = tracker.child_ids["b"]
    assert [m.step for m in client.get_metric_history(b, "exchange/from/a_store")] == [1, 2, 3, 4]
    assert [m.step for m in client.get_metric_history(tracker.child_ids["a"], "eval/avg/pass_at_1")] == [2, 4]
    listed = {f.path for f in client.list_artifacts(parent.info.run_id, "plots")}
    assert {f"plots/{name}" for name in VIEW_FILES} | {"plots/complementarity.json", "plots/flow"} <= listed
    assert {f.path for f in client.list_artifacts(parent.info.run_id, "plots/flow")} == {
        "plots/flow/step_000002.png", "plots/flow/step_000004.png"}
    local = Path(client.download_artifacts(parent.info.run_id, "exchange/flow_matrix.json", str(tmp_path / "dl")))
    flows = json.loads(local.read_text())["steps"]
    assert [f["step"] for f in flows] == [1, 2, 3, 4]
    assert flows[0] == {"step": 1, "donors": ["a", "b", "a@store"], "receivers": ["a", "b"],
                        "F": [[0, 2], [1, 0], [0, 0]]}
    assert {f.path for f in client.list_artifacts(parent.info.run_id)} >= {"config.yaml", "plots", "exchange"}
    pointer = json.loads((run_dir / "mlflow.json").read_text())
    assert pointer["parent_run_id"] == tracker.parent_id and set(pointer["child_run_ids"]) == {"a", "b"}
    assert (run_dir / "plots" / "flow_heatmap.png").read_bytes()[:4] == b"\x89PNG"


def test_views_failure_is_a_warning_not_an_exception(jobs, tmp_path):
    tracker = Tracker(jobs["uri"], "e", "j", {}, ["a"], tmp_path / "j")
    with pytest.warns(UserWarning, match="views at step 3 failed"):
        assert log_views(tracker, [{"step": 3, "models": None}], [], tmp_path / "none", 3) == {}


def _images(html_text: str) -> dict[str, bytes]:
    return {m.group(1): base64.b64decode(m.group(2))
            for m in re.finditer(r'<img id="(\w+)"[^>]*src="data:image/png;base64,([^"]+)"', html_text)}


def test_report_and_compare_read_back_from_mlflow(jobs, tmp_path):
    _, graft_dir = jobs["graft"]
    grpo_tracker, _ = jobs["grpo"]
    uri = jobs["uri"]

    data = load_run(str(graft_dir))
    assert data.source.startswith("MLflow sqlite:///") and data.status == "FINISHED"
    assert data.complementarity["all_fail"] == [4, 0]
    page = render_report(data)
    images = _images(page)
    assert set(images) == {"flow_heatmap", "exchange_rates", "peer_push", "eval_pass_at_1", "complementarity"}
    assert all(png[:4] == b"\x89PNG" for png in images.values())
    assert "<b>a</b> &rarr; <b>b</b>: 8 groups" in page and "a_store" in page
    assert "mean exchange/rate" in page and "mean gate/admission_rate" in page
    assert not re.search(r'(src|href)="(?!data:)', page)  # self-contained: nothing to fetch
    assert "<script" not in page and "<link" not in page

    # the CLI: report by run id (store in MLFLOW_TRACKING_URI), compare folders and ids
    out = tmp_path / "r.html"
    assert main(["report", grpo_tracker.parent_id, "--tracking-uri", uri,
                 "-o", str(out)]) == 0
    assert "No group moved between models" in out.read_text()
    cmp_out = tmp_path / "cmp.html"
    assert main(["compare", str(graft_dir), grpo_tracker.child_ids["a"], "--labels", "GRAFT,GRPO",
                 "--tracking-uri", uri, "-o", str(cmp_out)]) == 0
    page = cmp_out.read_text()
    assert set(_images(page)) == {"compare_curves"}
    assert "GRAFT: a" in page and "GRPO: b" in page and ">none<" in page and ">graft<" in page
    assert render_compare([data, data]).count(data.run_id[:8]) >= 2  # same names get told apart


def test_a_death_and_its_recovery_are_a_tag_metrics_and_a_report_section(jobs):
    tracker, graft_dir = jobs["graft"]
    client = MlflowClient(tracking_uri=jobs["uri"])
    run = client.get_run(tracker.parent_id)
    assert json.loads(run.data.tags["graftpool.fault.1700000000250"]) == {**DEATH, "recovery_s": 4.5}
    history = {key: [(m.step, m.value) for m in client.get_metric_history(tracker.parent_id, key)]
               for key in ("faults/trainer", "faults/deaths", "faults/recovery_s")}
    assert history == {"faults/trainer": [(2, 1.0)], "faults/deaths": [(2, 1.0)], "faults/recovery_s": [(2, 4.5)]}
    lines = [json.loads(line) for line in (graft_dir / "faults.jsonl").read_text().splitlines()]
    assert lines == [DEATH, {**DEATH, "recovery_s": 4.5}]  # the death, then its recovery

    page = render_report(load_run(str(graft_dir)))
    assert '<p id="faults">1 death, 1 recovered; time to recover: median 4.50 s, max 4.50 s.</p>' in page
    assert "trainer rank 1 of model b" in page and "went back to checkpoint step_000001" in page
    assert '<caption>restarts per actor</caption><tr><th class="l">actor</th><th class="">restarts</th></tr>' \
        '<tr><td class="l">trainer rank 1 of model b</td><td class="">1</td></tr>' in page
    grpo = render_report(load_run(str(jobs["grpo"][1])))
    assert '<p id="faults">No actor died in this run.</p>' in grpo


def test_report_of_a_folder_whose_server_is_gone_uses_metrics_jsonl(jobs, tmp_path):
    run_dir = tmp_path / "job"
    shutil.copytree(jobs["graft"][1], run_dir)
    pointer = json.loads((run_dir / "mlflow.json").read_text())
    pointer["tracking_uri"] = f"http://127.0.0.1:{free_port()}"
    (run_dir / "mlflow.json").write_text(json.dumps(pointer))
    with pytest.warns(UserWarning, match="could not be read"):
        data = load_run(str(run_dir))
    assert data.source.startswith("run folder") and data.run_id == pointer["parent_run_id"]
    np.testing.assert_array_equal(data.flow(), [[0, 8], [4, 0], [0, 3]])
    page = render_report(data)
    assert "could not be read" in page and 'id="flow_heatmap"' in page and 'id="complementarity"' in page
    assert data.faults == [{**DEATH, "recovery_s": 4.5}]  # from faults.jsonl
    assert '<p id="faults">1 death, 1 recovered' in page


def test_ui_defaults_to_loopback_and_links_the_experiment(jobs, tmp_path, monkeypatch):
    """``python -m dashboards ui``'s parts before the server starts (the server itself, started
    by `make dashboard` with a relative store, is checked in tests/test_dashboards_live.py):
    the default host is loopback, a relative store becomes an absolute sqlite URI with the
    artifacts beside it, and the banner links the experiment's real id."""
    assert build_parser().parse_args(["ui"]).host == "127.0.0.1"
    monkeypatch.chdir(jobs["out"].parent)
    relative = Path(jobs["out"].name) / "mlflow.db"
    store = (jobs["out"] / "mlflow.db").resolve()
    cmd = ui_command(relative, "127.0.0.1", 5123)
    option = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd), 2)}
    assert cmd[1] == "server" and option["--host"] == "127.0.0.1" and option["--port"] == "5123"
    assert option["--backend-store-uri"] == f"sqlite:///{store}"
    assert option["--artifacts-destination"] == str(store.parent / "mlartifacts")
    experiment = MlflowClient(tracking_uri=jobs["uri"]).get_experiment_by_name("graftpool").experiment_id
    banner = ui_banner(relative, "127.0.0.1", 5123, "graftpool")
    assert f"MLflow UI for {store}: http://127.0.0.1:5123" in banner
    assert f"http://127.0.0.1:5123/#/experiments/{experiment}/runs" in banner
    assert "experiments/" not in ui_banner(relative, "127.0.0.1", 5123, "no-such-experiment")
    assert _experiment_id(tmp_path / "missing.db", "graftpool") is None
    assert ui_command(Path("x.db"), "10.0.0.5", 1)[3] == "10.0.0.5", "--host is passed on as given"


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
