"""A run folder read on another machine than the one that ran it: what `ray rsync-down` of a
cluster's run (docs: cluster.yaml's header) brings back. The job writes a real sqlite MLflow store
under one folder (the head's ``/mnt/graftpool/runs``); the run folder and the store are copied to
another (``runs/`` on a laptop) and the first is gone, as after ``ray down``."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_dashboards import _history
from tests.test_dashboards_store import _tracked_job


@pytest.fixture()
def pulled(tmp_path: Path) -> dict[str, Path]:
    head = tmp_path / "head" / "runs"
    _, run_dir = _tracked_job(head, "graft-run", *_history())
    laptop = tmp_path / "laptop" / "runs"
    laptop.mkdir(parents=True)
    shutil.copytree(run_dir, laptop / "graft-run")  # ray rsync-down ... /mnt/graftpool/runs/<run.name> runs/
    shutil.copy2(head / "mlflow.db", laptop / "mlflow.db")  # ... /mnt/graftpool/runs/mlflow.db runs/
    shutil.rmtree(tmp_path / "head")  # ray down
    return {"head": head, "laptop": laptop, "run": laptop / "graft-run"}


def _report(run: Path) -> str:
    """``python -m dashboards report RUN`` in a process of its own, as on the laptop: this one's
    MLflow keeps the job's store open, a deleted file included."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "dashboards", "report", str(run)], cwd=run.parent.parent,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_a_run_pulled_back_with_its_store_is_read_from_the_copied_store(pulled):
    out = _report(pulled["run"])
    assert f"read from MLflow sqlite:///{(pulled['laptop'] / 'mlflow.db').resolve()})" in out, out
    assert "could not be read" not in out and "metrics.jsonl" not in out
    assert not pulled["head"].exists(), "MLflow made a new empty store at the head's path"
    page = (pulled["run"] / "report.html").read_text()
    assert "FINISHED" in page and 'id="complementarity"' in page  # from the folder's plots/


def test_a_run_pulled_back_without_its_store_says_so_and_creates_none(pulled):
    (pulled["laptop"] / "mlflow.db").unlink()
    out = _report(pulled["run"])
    assert "mlflow.db is not on this machine, nor a copy of it" in out and "(metrics.jsonl)" in out, out
    assert not pulled["head"].exists() and not (pulled["laptop"] / "mlflow.db").exists()
