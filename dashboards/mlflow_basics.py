"""What the tracker (``dashboards/tracking.py``) and the readers of its store (``dashboards/data.py``)
share: MLflow-safe metric names, a config flattened into params, short HTTP calls, the fault tags'
prefix, and a sqlite store's artifact folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")
FAULT_TAG = "graftpool.fault."  # + the death's time in ms: one tag per death on the job's run
RESUME_TAG = "graftpool.resume."  # + the time in ms a job went back to the step its value names
MAX_TAG_CHARS = 5000  # MLflow's limit on a tag value


def safe_metric_name(name: str) -> str:
    return _UNSAFE.sub("_", name)


def flatten_params(prefix: str, value, out: dict[str, str]) -> None:
    """``value`` (nested dicts, lists of dicts) into ``out`` as dotted keys, each value cut at 500 characters (MLflow params)."""
    if isinstance(value, dict):
        for k, v in value.items():
            flatten_params(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            flatten_params(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = str(value)[:500]


@contextlib.contextmanager
def quick_http(timeout_s: int = 5, retries: int = 0):
    """Short MLflow HTTP timeout and no retries/backoff, for the duration of the block, for
    the variables the user has not set; restored afterwards."""
    wanted = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(int(timeout_s)),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(int(retries)),
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
              "MLFLOW_HTTP_REQUEST_BACKOFF_JITTER": "0"}
    mine = {k: v for k, v in wanted.items() if k not in os.environ}
    os.environ.update(mine)
    try:
        yield
    finally:
        for k in mine:
            os.environ.pop(k, None)


def default_artifact_location(uri: str) -> str | None:
    """For a ``sqlite:///.../mlflow.db`` store: ``.../mlartifacts`` next to it (MLflow's own
    default is ``./mlruns`` in whatever folder the job started from)."""
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):])
        if not db.is_absolute():
            db = db.resolve()
        return (db.parent / "mlartifacts").as_uri()
    return None


def fault_tags(fault_path: Path) -> dict[str, str]:
    """The ``graftpool.fault.<ms>`` tag of every death in ``faults.jsonl`` (a recovery's line
    replacing its death's), as ``Tracker.log_fault`` set them ({} without the file)."""
    tags: dict[str, str] = {}
    if fault_path.is_file():
        for line in fault_path.read_text().splitlines():
            if line.strip():
                tags[f"{FAULT_TAG}{int(json.loads(line)['time'] * 1000)}"] = line[:MAX_TAG_CHARS]
    return tags
