"""The dashboards end to end: `make dashboard` serves a real MLflow tracking server on
127.0.0.1; a short 2-model job (real Ray actors, models, math-verify) logs to it through
MLFLOW_TRACKING_URI, with the network to the server cut during step 2 and restored after
it; the runs, metrics and artifacts are read back with MlflowClient (also while the job
runs); the HTML report is built from the server; and Debian's headless chromium opens the
MLflow UI and the report, saves screenshots and checks that the exchange metrics and the
flow heatmap are on the page (skipped, with the reason, where chromium is not installed).
The job's tracking URI carries a password (``alice:s3cret@``; the server has no auth and
ignores it): it must reach no file of the run folder, no warning or log line, no MLflow
param, tag or artifact.

Screenshots go to $GRAFTPOOL_SCREENSHOT_DIR if set, else to the test's temporary folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from dashboards.__main__ import _experiment_id
from dashboards.data import complementarity
from dashboards.views import VIEW_FILES
from orchestrator.config import load_config
from orchestrator.controller.loop import train
from tests.browser import capture, dark_blue_pixels, find_chromium
from tests.live_job import LogRecords, Watcher
from tests.netcut import (
    Relay,
    free_port,
    listening_addresses,
    start_dashboard,
    stop_group,
    wait_http,
)
from tests.platform_checks import read_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
MODELS = ["llama-char", "gpt2-bpe"]
SECRET = "s3cret"
STEPS = 3
SMALL = [f"run.steps={STEPS}", "run.eval_every=2", "algorithm.prompt_batch=16", "eval.max_prompts=4",
         "eval.samples=2"]
CHILD_METRICS = ["train/reward_mean", "train/loss", "train/own_clip_frac", "train/peer_clip_frac",
                 "exchange/rate", "exchange/all_fail_rate", "exchange/received", "exchange/given",
                 "gate/admission_rate", "gate/mean_s", "gate/mean_w", "time/generate", "time/train",
                 "exchange/peer_push", "exchange/peer_push_abs", "train/peer_grad_share", "train/updates_peer",
                 "train/update_0/kind", "train/update_0/grad_norm"]


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory):
    """`make dashboard` on a store of our own, on a free port."""
    out = tmp_path_factory.mktemp("dashboard")
    port = free_port()
    # STORE relative to the Makefile's folder: the UI must resolve it for the server
    proc, cmd = start_dashboard(Path(os.path.relpath(out / "mlflow.db", ROOT)), port, ROOT, out / "ui.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 240, proc)
        yield {"port": port, "url": f"http://127.0.0.1:{port}", "store": out / "mlflow.db",
               "log": out / "ui.log", "cmd": cmd, "proc": proc}
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def live_run(dashboard, ray_local, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    config = load_config(DEMO, [*SMALL, f"run.output_dir={out}", "run.name=live"])
    relay = Relay(dashboard["port"])
    watcher = Watcher(out / "live", relay, dashboard["url"], MODELS)
    started = time.perf_counter()
    logged = LogRecords()
    try:
        with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings(record=True) as caught, logged:
            warnings.simplefilter("always")
            mp.setattr(sys, "excepthook", sys.excepthook)  # train() wraps it (graftpool.redaction)
            mp.setattr(threading, "excepthook", threading.excepthook)
            mp.setenv("MLFLOW_TRACKING_URI", f"http://alice:{SECRET}@127.0.0.1:{relay.port}")
            mp.setenv("GRAFTPOOL_TRACKING_RETRY_S", "0")  # try again at every call
            watcher.start()
            try:
                summary = train(config)
            finally:
                watcher.done.set()
                watcher.join(10)
    finally:
        relay.close()
    return {"summary": summary, "config": config, "run_dir": out / "live", "watcher": watcher,
            "warnings": [str(w.message) for w in caught], "seconds": time.perf_counter() - started,
            "logs": logged.lines, "relay_port": relay.port,
            "client": MlflowClient(tracking_uri=dashboard["url"]), "url": dashboard["url"]}


def _runs(live):
    client = live["client"]
    parent = client.get_run(live["summary"]["mlflow_run_id"])
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    return parent, {c.data.tags["graftpool.model"]: c for c in children}


def test_make_dashboard_serves_mlflow_on_loopback_and_prints_its_address(dashboard):
    text = dashboard["log"].read_text()
    assert f"http://127.0.0.1:{dashboard['port']}" in text, text[-2000:]
    assert listening_addresses(dashboard["port"]) == {"0100007F"}, "bound to 127.0.0.1 only"
    # the server `make dashboard` exec'd: the relative STORE as an absolute sqlite URI, the
    # artifacts beside it, MLflow's job-execution feature off
    root = psutil.Process(dashboard["proc"].pid)
    servers = [p for p in [root, *root.children(recursive=True)] if "--backend-store-uri" in p.cmdline()]
    assert servers, [p.cmdline() for p in root.children(recursive=True)]
    cmdline = servers[0].cmdline()
    option = {cmdline[i]: cmdline[i + 1] for i in range(len(cmdline) - 1) if cmdline[i].startswith("--")}
    store = dashboard["store"].resolve()
    assert option["--backend-store-uri"] == f"sqlite:///{store}" and option["--host"] == "127.0.0.1"
    assert option["--artifacts-destination"] == str(store.parent / "mlartifacts")
    assert servers[0].environ().get("MLFLOW_SERVER_ENABLE_JOB_EXECUTION") == "false"


def test_the_server_keeps_runs_and_artifacts_in_the_dashboards_store(dashboard, live_run):
    """What the job logged through the server is in the store `make dashboard` was given: the
    experiment (the id the UI's banner reads straight from the sqlite file) and the artifacts
    beside it."""
    parent, _ = _runs(live_run)
    assert _experiment_id(dashboard["store"], "graftpool") == parent.info.experiment_id
    artifacts = dashboard["store"].parent / "mlartifacts"
    assert [p for p in artifacts.rglob("config.yaml") if parent.info.run_id in p.parts], \
        "the run's config.yaml artifact is under the store's mlartifacts"


def test_metrics_show_up_on_the_server_while_the_job_runs(live_run):
    snapshots = live_run["watcher"].snapshots
    live = [s for s in snapshots if s.get("status") == "RUNNING" and s["steps"]]
    assert live, f"no metric was visible before the end of the job: {snapshots}"
    assert live[0]["steps"][0] == 1


def test_cut_network_mid_run_warns_trains_on_and_replays_when_back(live_run):
    watcher, messages = live_run["watcher"], live_run["warnings"]
    assert [e for e, _ in watcher.events] == ["cut", "restored"]
    assert any("is unreachable" in m and "metrics are kept in" in m for m in messages), messages
    assert any("reachable again" in m for m in messages), messages
    assert live_run["summary"]["steps"] == STEPS
    parent, children = _runs(live_run)
    assert parent.info.status == "FINISHED"
    for child in children.values():  # step 2 was logged while the server was out of reach
        history = live_run["client"].get_metric_history(child.info.run_id, "train/reward_mean")
        assert sorted(m.step for m in history) == [1, 2, 3]
    local = [json.loads(line) for line in (live_run["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    assert {r["step"] for r in local if "metrics" in r} == {1, 2, 3}


def test_the_password_of_the_tracking_uri_reaches_no_file_warning_log_param_or_artifact(live_run):
    run_dir, client = live_run["run_dir"], live_run["client"]
    host = f"127.0.0.1:{live_run['relay_port']}"
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"metrics.jsonl", "config.yaml", "summary.json", "mlflow.json"} <= {p.name for p in files}
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []
    # mlflow.json names the server, without the password (the reader brings it)
    assert json.loads((run_dir / "mlflow.json").read_text())["tracking_uri"] == f"http://alice@{host}"
    messages = live_run["warnings"]
    assert any(f"***@{host} is unreachable" in m for m in messages), messages
    assert [m for m in messages if SECRET in m] == []
    assert [line for line in live_run["logs"] if SECRET in line] == []
    parent, children = _runs(live_run)
    for run in [parent, *children.values()]:
        assert SECRET not in json.dumps([run.data.params, run.data.tags, run.info.artifact_uri])
        stack, seen = [None], 0
        while stack:
            for item in client.list_artifacts(run.info.run_id, stack.pop()):
                if item.is_dir:
                    stack.append(item.path)
                    continue
                seen += 1
                path = Path(client.download_artifacts(run.info.run_id, item.path, str(run_dir.parent / "leak")))
                assert SECRET.encode() not in path.read_bytes(), item.path
        assert run is not parent or seen >= 3  # config.yaml, summary.json, flow matrix, views


def test_job_layout_on_the_server_params_config_children_metrics(live_run):
    client, config, run_dir = live_run["client"], live_run["config"], live_run["run_dir"]
    parent, children = _runs(live_run)
    params = parent.data.params
    assert params["exchange.name"] == "graft" and params["algorithm.prompt_batch"] == "16"
    assert params["models.0.name"] == "llama-char" and params["run.steps"] == str(STEPS)
    config_path = client.download_artifacts(parent.info.run_id, "config.yaml", str(run_dir / "dl"))
    assert Path(config_path).read_text() == (run_dir / "config.yaml").read_text()
    assert set(children) == set(MODELS)
    sets = [e.name for e in config.data.eval]
    for model, child in children.items():
        other = next(m for m in MODELS if m != model)
        keys = set(child.data.metrics)
        assert set(CHILD_METRICS) | {f"exchange/from/{other}"} <= keys, set(CHILD_METRICS) - keys
        for name in [*sets, "avg"]:
            history = client.get_metric_history(child.info.run_id, f"eval/{name}/pass_at_1")
            assert sorted(m.step for m in history) == [2, 3]
    assert {"exchange/routes", "time/step", "exchange/flow/llama-char/gpt2-bpe",
            "exchange/flow/gpt2-bpe/llama-char"} <= set(parent.data.metrics)


def test_flow_matrix_metrics_artifact_and_store_agree(live_run):
    client, run_dir = live_run["client"], live_run["run_dir"]
    parent, children = _runs(live_run)
    pid = parent.info.run_id
    flows = json.loads(Path(client.download_artifacts(pid, "exchange/flow_matrix.json", str(run_dir / "dl")))
                       .read_text())["steps"]
    assert [f["step"] for f in flows] == [1, 2, 3]
    grafted: dict[tuple[int, str, str], set] = {}
    for row in read_store(run_dir):
        if row["kind"] == "graft":
            grafted.setdefault((row["step"], row["source_model"], row["model"]), set()).add(row["prompt_id"])
    total = 0
    for f in flows:
        assert f["donors"] == MODELS and f["receivers"] == MODELS
        for d, donor in enumerate(MODELS):
            for r, receiver in enumerate(MODELS):
                if d == r:
                    assert f["F"][d][r] == 0
                    continue
                count = f["F"][d][r]
                total += count
                assert count == len(grafted.get((f["step"], donor, receiver), ()))
                metric = {m.step: m.value for m in client.get_metric_history(pid, f"exchange/flow/{donor}/{receiver}")}
                assert metric[f["step"]] == count
                inflow = {m.step: m.value for m in client.get_metric_history(
                    children[receiver].info.run_id, f"exchange/from/{donor}")}
                assert inflow[f["step"]] == count
    assert total > 0, "the demo pair exchanges groups"


def test_views_are_artifacts_of_the_parent_run(live_run):
    client, run_dir = live_run["client"], live_run["run_dir"]
    parent, _ = _runs(live_run)
    pid = parent.info.run_id
    listed = {f.path for f in client.list_artifacts(pid, "plots")}
    assert {f"plots/{name}" for name in VIEW_FILES} | {"plots/complementarity.json"} <= listed
    snapshots = {f.path for f in client.list_artifacts(pid, "plots/flow")}
    assert snapshots == {"plots/flow/step_000002.png", "plots/flow/step_000003.png"}  # eval step 2 and the end
    heatmap = Path(client.download_artifacts(pid, "plots/flow_heatmap.png", str(run_dir / "dl")))
    assert heatmap.read_bytes()[:4] == b"\x89PNG" and dark_blue_pixels(heatmap) > 500
    comp = json.loads(Path(client.download_artifacts(pid, "plots/complementarity.json", str(run_dir / "dl")))
                      .read_text())
    assert comp == complementarity(run_dir / "trajectories", MODELS)
    assert sum(comp["all_fail"]) > 0


def test_report_command_reads_the_run_back_from_the_server(live_run, tmp_path):
    out = tmp_path / "report.html"
    result = subprocess.run([sys.executable, "-m", "dashboards", "report", str(live_run["run_dir"]),
                             "--tracking-uri", live_run["url"], "-o", str(out)],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"read from MLflow {live_run['url']}" in result.stdout
    page = out.read_text()
    for text in ('id="flow_heatmap"', 'id="exchange_rates"', 'id="eval_pass_at_1"', 'id="complementarity"',
                 'id="who_fed_whom"', 'id="peer_push"', "mean exchange/peer_push_ratio", "mean exchange/rate", "mean exchange/all_fail_rate",
                 live_run["summary"]["mlflow_run_id"]):
        assert text in page, text
    live_run["report"] = out


# -- the browser -------------------------------------------------------------------------------

CHROMIUM = find_chromium()
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium; "
                             "`make test` installs it when it runs as root with apt-get)")


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    folder = os.environ.get("GRAFTPOOL_SCREENSHOT_DIR")
    path = Path(folder) if folder else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@needs_chromium
def test_browser_mlflow_ui_shows_the_exchange_metrics_and_the_heatmap(live_run, shots):
    parent, children = _runs(live_run)
    exp, pid = parent.info.experiment_id, parent.info.run_id
    base = f"{live_run['url']}/#/experiments/{exp}/runs"
    ml = "?workflowType=machine_learning"  # the UI's "Model training" view

    # the job's run: the flow metrics F[donor, receiver] and its two model runs
    dom = capture(CHROMIUM, f"{base}/{pid}{ml}", shots / "mlflow_job_run.png", size=(1400, 1400))
    for text in ("exchange/flow/llama-char/gpt2-bpe", "exchange/flow/gpt2-bpe/llama-char", "exchange/routes",
                 "live/llama-char", "live/gpt2-bpe"):
        assert text in dom, text

    # one model's run: every exchange metric
    child = children["gpt2-bpe"].info.run_id
    dom = capture(CHROMIUM, f"{base}/{child}{ml}", shots / "mlflow_model_run.png", size=(1400, 2400))
    for key in [*CHILD_METRICS, "exchange/from/llama-char", "eval/avg/pass_at_1"]:
        assert f">{key}<" in dom, key

    # the flow heatmap, served by the UI from the job's artifacts
    shot = shots / "mlflow_flow_heatmap.png"
    dom = capture(CHROMIUM, f"{base}/{pid}/artifacts/plots/flow_heatmap.png{ml}", shot)
    assert 'alt="plots/flow_heatmap.png"' in dom and 'src="blob:' in dom
    assert dark_blue_pixels(shot) > 3000, "the heatmap is not visible in the screenshot"
    print(f"screenshots: {shots}")


@needs_chromium
def test_browser_html_report_shows_the_flow_and_the_rates(live_run, shots, tmp_path):
    report = live_run.get("report")
    if report is None:  # run alone: build it here
        report = tmp_path / "report.html"
        subprocess.run([sys.executable, "-m", "dashboards", "report", str(live_run["run_dir"]),
                        "--tracking-uri", live_run["url"], "-o", str(report)], check=True, cwd=ROOT,
                       capture_output=True, timeout=300)
    shot = shots / "report.png"
    dom = capture(CHROMIUM, report.as_uri(), shot, size=(1200, 1500), budget_ms=2000)
    for text in ("Which model fed which", "llama-char</b> → <b>gpt2-bpe", "gpt2-bpe</b> → <b>llama-char",
                 "mean exchange/rate", "mean gate/admission_rate", "Complementarity"):
        assert text in dom, text
    assert dark_blue_pixels(shot) > 3000, "the heatmap is not visible in the screenshot"
    print(f"screenshots: {shots}")
