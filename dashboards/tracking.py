"""MLflow logging: one parent run per job, one nested child run per model.

Metric names (all MLflow-safe): ``train/...``, ``exchange/...``, ``gate/...``,
``eval/<set>/pass_at_1`` (MLflow names allow no "@"), ``time/<phase>``. The pool-level flow matrix goes to the parent
run as ``exchange/flow/<donor>/<receiver>``. If the tracking server cannot be reached,
training goes on: metrics are kept in ``metrics.jsonl`` in the run folder and a warning
says so.
"""

from __future__ import annotations

import json
import math
import re
import time
import warnings
from pathlib import Path

from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-./ ]")


def safe_metric_name(name: str) -> str:
    return _UNSAFE.sub("_", name)


def _flatten(prefix: str, value, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flatten(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = str(value)[:500]


class Tracker:
    def __init__(self, uri: str, experiment: str, run_name: str, config: dict, models: list[str],
                 local_dir: Path):
        self.local_log = Path(local_dir) / "metrics.jsonl"
        self.ok = True
        self.parent_id: str | None = None
        self.child_ids: dict[str, str] = {}
        try:
            self.client = MlflowClient(tracking_uri=uri)
            found = self.client.get_experiment_by_name(experiment)
            exp_id = found.experiment_id if found else self.client.create_experiment(experiment)
            self.parent_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
            params: dict[str, str] = {}
            _flatten("", config, params)
            items = [Param(k, v) for k, v in sorted(params.items())]
            for start in range(0, len(items), 100):
                self.client.log_batch(self.parent_id, params=items[start:start + 100])
            for model in models:
                child = self.client.create_run(
                    exp_id, run_name=f"{run_name}/{model}",
                    tags={"mlflow.parentRunId": self.parent_id, "graftpool.model": model})
                self.child_ids[model] = child.info.run_id
        except Exception as exc:  # noqa: BLE001 - any tracking failure must not stop training
            self._fail(exc)

    def _fail(self, exc: Exception) -> None:
        if self.ok:
            warnings.warn(f"MLflow tracking is unreachable ({exc}); metrics are kept in "
                          f"{self.local_log}", stacklevel=3)
        self.ok = False

    def log(self, step: int, metrics: dict[str, float], model: str | None = None) -> None:
        clean = {safe_metric_name(k): float(v) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))}
        with self.local_log.open("a") as f:
            f.write(json.dumps({"step": step, "model": model, "metrics": clean}) + "\n")
        if not self.ok:
            return
        run_id = self.child_ids.get(model) if model else self.parent_id
        now = int(time.time() * 1000)
        try:
            batch = [Metric(k, v, now, step) for k, v in clean.items()]
            for start in range(0, len(batch), 500):
                self.client.log_batch(run_id, metrics=batch[start:start + 500])
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def log_artifact(self, path: str | Path, model: str | None = None) -> None:
        if not self.ok:
            return
        try:
            self.client.log_artifact(self.child_ids.get(model) if model else self.parent_id, str(path))
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def finish(self, status: str = "FINISHED") -> None:
        if not self.ok:
            return
        try:
            for run_id in [*self.child_ids.values(), self.parent_id]:
                self.client.set_terminated(run_id, status)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)
