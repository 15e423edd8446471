"""Dashboards read back from a real sqlite MLflow store: two jobs (GRAFT, GRPO) logged the way
the controller logs them, then the tracker's parent and child runs, the views hook, the HTML
report and comparison, a death and its recovery, a folder whose server is gone, and the `ui`
command line."""
from __future__ import annotations

import base64
import json
import re
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from dashboards.__main__ import _experiment_id, build_parser, main, ui_banner, ui_command
from dashboards.data import (
    load_run,
)
from dashboards.report import render_compare, render_report
from dashboards.tracking import Tracker
from dashboards.views import VIEW_FILES, log_views
from orchestrator.controller.trajectory_store import TrajectoryStore
from tests.netcut import free_port
from tests.test_dashboards import _history, _own

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


def test_the_ui_banner_links_the_runs_of_an_experiment_not_named_graftpool(tmp_path):
    """Issue #51's twenty-seventh read: `make dashboard STORE=runs/graft-pair-3b/mlflow.db` on the
    GPU template's store (its ``tracking.experiment`` is ``graft-pair-3b``) printed no runs link,
    the banner looking for the experiment ``graftpool`` only, though operations.md tells the user to
    open the link it prints. Without ``--experiment``, every experiment of the store is linked."""
    store = tmp_path / "mlflow.db"
    experiment = MlflowClient(tracking_uri=f"sqlite:///{store}").create_experiment("graft-pair-3b")
    default = build_parser().parse_args(["ui", "--store", str(store)]).experiment  # `make dashboard STORE=...`
    banner = ui_banner(store, "127.0.0.1", 5123, default)
    assert f"runs of experiment 'graft-pair-3b': http://127.0.0.1:5123/#/experiments/{experiment}/runs" in banner, banner
    assert "'Default'" not in banner


def test_the_ui_banner_on_a_store_copied_from_the_head_points_at_the_run_folders_plots(tmp_path):
    """Issue #51's twenty-eighth read: `make dashboard STORE=runs/<name>/mlflow.db` over the store
    copied back from the head (cluster.yaml's header) printed that the views are in the job's
    Artifacts tab; the copy keeps the head's ``file://`` artifact paths, so MLflow lists nothing
    there on the laptop (operations.md: the views are in the run folder's ``plots/``)."""
    head = tmp_path / "head" / "runs"
    _, run_dir = _tracked_job(head, "graft-pair-3b", *_history())
    copy = tmp_path / "laptop" / "runs" / run_dir.name
    shutil.copytree(run_dir, copy)                             # ray rsync-down .../runs/<name> runs/
    shutil.copy2(head / "mlflow.db", copy / "mlflow.db")       # ray rsync-down .../runs/mlflow.db runs/<name>/
    shutil.rmtree(tmp_path / "head")                           # the head is not this machine
    parent = json.loads((copy / "mlflow.json").read_text())["parent_run_id"]
    assert MlflowClient(tracking_uri=f"sqlite:///{copy / 'mlflow.db'}").list_artifacts(parent) == []
    banner = ui_banner(copy / "mlflow.db", "127.0.0.1", 5123, build_parser().parse_args(["ui"]).experiment)
    assert "views are in its Artifacts tab" not in banner, banner
    assert "run folder's plots/" in banner and str(head / "mlartifacts") in banner, banner
    assert (copy / "plots" / "flow_heatmap.png").is_file()
    local = ui_banner(tmp_path / "laptop" / "runs" / "none.db", "127.0.0.1", 5123)
    assert "Artifacts tab" not in local  # no store: the address alone
