"""Helpers of tests/test_dashboards_live.py: a thread that cuts and restores the network to the
tracking server while a job runs and polls the server for its metrics, and a log handler that
keeps every log line of the job's process."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.netcut import Relay


class Watcher(threading.Thread):
    """Runs beside the job: cuts the network to the server once step 1 is logged, restores
    it once step 2 is logged, and polls the server directly (not through the relay) for
    the job's metrics while the job runs."""

    def __init__(self, run_dir: Path, relay: Relay, server_url: str, models: list[str]):
        super().__init__(daemon=True)
        self.run_dir, self.relay, self.server_url, self.models = run_dir, relay, server_url, models
        self.done = threading.Event()
        self.events: list[tuple[str, int]] = []
        self.snapshots: list[dict] = []

    def _pool_steps(self) -> set[int]:
        path = self.run_dir / "metrics.jsonl"
        if not path.exists():
            return set()
        steps = set()
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "metrics" in record and record.get("model") is None:
                steps.add(record["step"])
        return steps

    def _snapshot(self, client: MlflowClient) -> None:
        pointer = self.run_dir / "mlflow.json"
        if not pointer.exists():
            return
        ids = json.loads(pointer.read_text())
        if len(ids.get("child_run_ids", {})) < len(self.models):
            return
        status = client.get_run(ids["parent_run_id"]).info.status
        steps = [m.step for m in client.get_metric_history(ids["child_run_ids"][self.models[0]], "train/reward_mean")]
        self.snapshots.append({"status": status, "steps": steps})

    def run(self) -> None:
        client = MlflowClient(tracking_uri=self.server_url)
        last_poll = 0.0
        while not self.done.is_set():
            steps = self._pool_steps()
            if 1 in steps and not self.events:
                self.relay.cut()
                self.events.append(("cut", max(steps)))
            elif 2 in steps and len(self.events) == 1:
                self.relay.restore()
                self.events.append(("restored", max(steps)))
            if time.monotonic() - last_poll > 0.5:
                last_poll = time.monotonic()
                try:
                    self._snapshot(client)
                except Exception as exc:  # noqa: BLE001 - recorded, judged by the test
                    self.snapshots.append({"error": repr(exc)})
            time.sleep(0.05)


class LogRecords(logging.Handler):
    """Every log line of the job's process (root and MLflow's own logger), formatted; the
    record factory train() installs goes back to the previous one on exit."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.loggers = [logging.getLogger(), logging.getLogger("mlflow")]

    def emit(self, record):
        self.lines.append(self.format(record))

    def __enter__(self):
        self.factory = logging.getLogRecordFactory()
        for logger in self.loggers:
            logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        for logger in self.loggers:
            logger.removeHandler(self)
        logging.setLogRecordFactory(self.factory)
