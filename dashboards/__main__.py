"""``python -m dashboards``: HTML reports from MLflow, and the MLflow UI for the local store.

  report RUN_ID_OR_DIR [-o report.html]    one run: plots and summary tables
  compare RUN [RUN ...] [-o compare.html]  several runs on the same axes (GRPO vs GRAFT vs pool)
  ui [--store runs/mlflow.db] [--port 5000] the MLflow UI on 127.0.0.1 (what `make dashboard` runs)

A RUN is a run folder (``runs/<name>``: its ``mlflow.json`` says where its MLflow records
are) or an MLflow run id (of the job's parent run or of one of its model runs), looked up
in ``--tracking-uri``, else ``$MLFLOW_TRACKING_URI``, else ``runs/mlflow.db``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname


def _default_out(ref: str, stem: str) -> Path:
    path = Path(ref)
    return path / f"{stem}.html" if path.is_dir() else Path(f"{stem}-{ref[:8]}.html")


def cmd_report(args: argparse.Namespace) -> int:
    from dashboards.data import load_run
    from dashboards.report import render_report, write

    data = load_run(args.run, args.tracking_uri)
    out = write(render_report(data, window=args.window), args.out or _default_out(args.run, "report"))
    print(f"report of run {data.name} ({len(data.steps())} steps, {len(data.models)} models, read from "
          f"{data.source}): {out.resolve()}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from dashboards.data import load_run
    from dashboards.report import render_compare, write

    runs = [load_run(ref, args.tracking_uri) for ref in args.runs]
    labels = args.labels.split(",") if args.labels else None
    if labels and len(labels) != len(runs):
        print(f"error: {len(labels)} labels for {len(runs)} runs", file=sys.stderr)
        return 2
    out = write(render_compare(runs, labels), args.out or Path("compare.html"))
    print(f"comparison of {len(runs)} runs: {out.resolve()}")
    return 0


def ui_command(store: Path, host: str, port: int, workers: int = 1) -> list[str]:
    """The MLflow UI (tracking server) over a local sqlite store, bound to ``host``."""
    mlflow = Path(sys.executable).with_name("mlflow")
    return [str(mlflow) if mlflow.exists() else "mlflow", "server", "--host", host, "--port", str(port),
            "--workers", str(workers), "--backend-store-uri", f"sqlite:///{store.resolve()}",
            "--artifacts-destination", str((store.parent / "mlartifacts").resolve())]


def _experiment_rows(store: Path) -> dict[str, tuple[str, str]]:
    """A local sqlite store's experiments, name -> (id, artifact location) in creation order,
    MLflow's empty ``Default`` left out; read without MLflow (no migrations)."""
    import sqlite3

    if not store.is_file():
        return {}
    try:
        with contextlib.closing(sqlite3.connect(f"file:{store.resolve()}?mode=ro", uri=True)) as db:
            rows = db.execute("SELECT name, experiment_id, artifact_location FROM experiments "
                              "ORDER BY experiment_id").fetchall()
    except sqlite3.Error:
        return {}
    return {str(name): (str(eid), str(location or "")) for name, eid, location in rows if name != "Default"}


def _experiments(store: Path) -> dict[str, str]:
    """A local sqlite store's experiments, name -> id in creation order (``Default`` left out)."""
    return {name: eid for name, (eid, _) in _experiment_rows(store).items()}


def _experiment_id(store: Path, name: str) -> str | None:
    """The experiment's id in a local sqlite store (None: it has none of that name)."""
    return _experiments(store).get(name)


def _missing_artifact_root(location: str) -> str | None:
    """The local folder an experiment's artifacts were written to, if this machine lacks it: a
    store copied from a cluster's head keeps the head's ``file://`` paths, which the UI then reads
    (None for a folder that is here, or a remote root such as ``s3://``)."""
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        return None
    folder = url2pathname(parsed.path) if parsed.scheme == "file" else location
    return None if Path(folder).exists() else folder


def cmd_ui(args: argparse.Namespace) -> int:
    store = Path(args.store)
    if not store.exists():
        print(f"note: {store} does not exist yet (no run has written to it: try `make demo`); "
              "starting the UI on an empty store")
        store.parent.mkdir(parents=True, exist_ok=True)
    cmd = ui_command(store, args.host, args.port)
    print(ui_banner(store, args.host, args.port, args.experiment), flush=True)
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION=os.environ.get(
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"))
    os.execvpe(cmd[0], cmd, env)
    return 0  # not reached


def ui_banner(store: Path, host: str, port: int, experiment_name: str | None = None) -> str:
    """What ``ui`` prints before the server starts: its address and the link to the runs page of
    ``experiment_name`` if the store has it, or (None) of every experiment it has
    (``tracking.experiment``: ``graftpool`` by default, the GPU template's ``graft-pair-3b``)."""
    address = f"http://{host}:{port}"
    lines = [f"MLflow UI for {store.resolve()}: {address}  (Ctrl-C stops it)"]
    rows = _experiment_rows(store)
    if experiment_name is not None:
        rows = {experiment_name: rows[experiment_name]} if experiment_name in rows else {}
    for name, (experiment, _) in rows.items():
        lines.append(f"  runs of experiment '{name}': {address}/#/experiments/{experiment}/runs"
                     "?workflowType=machine_learning")
    missing = sorted({m for _, loc in rows.values() if (m := _missing_artifact_root(loc)) is not None})
    if missing:
        lines.append("  (a job is a parent run: expand it for one run per model; its Artifacts tab is empty here: the "
                     f"store's artifacts were written to {', '.join(missing)}, which this machine does not have, as in "
                     "a store copied from a cluster's head; plots/flow_heatmap.png and the other views are in each "
                     "run folder's plots/)")
    elif rows:
        lines.append("  (a job is a parent run: expand it for one run per model; plots/flow_heatmap.png and "
                     "the other views are in its Artifacts tab)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dashboards", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("report", help="a self-contained HTML report of one run")
    rep.add_argument("run", help="run folder or MLflow run id")
    rep.add_argument("-o", "--out", help="HTML file (default: RUN_DIR/report.html or ./report-<id>.html)")
    rep.add_argument("--tracking-uri", default=None)
    rep.add_argument("--window", type=int, default=None,
                     help="steps covered by the first flow-heatmap panel (default: the whole run)")
    rep.set_defaults(func=cmd_report)
    cmp = sub.add_parser("compare", help="several runs side by side on the same axes")
    cmp.add_argument("runs", nargs="+", help="run folders or MLflow run ids")
    cmp.add_argument("-o", "--out", help="HTML file (default: ./compare.html)")
    cmp.add_argument("--labels", help="comma-separated labels, one per run (default: run names)")
    cmp.add_argument("--tracking-uri", default=None)
    cmp.set_defaults(func=cmd_compare)
    ui = sub.add_parser("ui", help="the MLflow UI on 127.0.0.1 for a local store")
    ui.add_argument("--store", default="runs/mlflow.db", help="sqlite file (default: runs/mlflow.db)")
    ui.add_argument("--host", default="127.0.0.1")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--experiment", default=None,
                    help="experiment whose runs page to print (default: every experiment of the store)")
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Secrets (``--tracking-uri``'s password, credential variables) are masked in every
    message, warning and traceback (``graftpool.redaction``)."""
    from graftpool.redaction import install, register_secrets_in

    install()
    args = build_parser().parse_args(argv)
    register_secrets_in(getattr(args, "tracking_uri", None) or "")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
