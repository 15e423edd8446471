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


ROOT = Path(__file__).resolve().parents[1]
HEAD_RUNS = "/mnt/graftpool/runs"


def _header_copies(path: Path, run_name: str) -> list[tuple[str, str]]:
    """The ``ray rsync-down cluster.yaml SOURCE TARGET`` lines of a file's header comment, as
    (source under the head's runs folder, target), ``run_name`` written ``<run.name>``. A header
    with no line of its own for the MLflow store (its prose: the run's line with
    ``/mnt/graftpool/runs/mlflow.db`` for the source) copies it where the run folder goes."""
    copies = []
    for line in path.read_text().splitlines():
        if line.startswith("#") and "ray rsync-down cluster.yaml " in line:
            _, _, _, source, target = line.lstrip("# ").split(" #")[0].split()
            copies.append((source.replace(run_name, "<run.name>"), target.replace(run_name, "<run.name>")))
    assert copies and copies[0][0] == f"{HEAD_RUNS}/<run.name>", copies
    if not any(source == f"{HEAD_RUNS}/mlflow.db" for source, _ in copies):
        copies.append((f"{HEAD_RUNS}/mlflow.db", copies[0][1]))
    return copies


def _rsync_down(source: Path, target: Path) -> None:
    """``rsync -a SOURCE TARGET`` with no trailing slash on SOURCE: into TARGET (made if missing),
    under SOURCE's name, replacing a file of that name."""
    target.mkdir(exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target / source.name, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target / source.name)


@pytest.mark.parametrize("header", ["cluster.yaml", "configs/gpu/graft_pair_3b.yaml"])
def test_the_headers_copies_keep_the_laptops_own_store_and_bring_the_runs(tmp_path: Path, header: str):
    """Issue #51's twenty-sixth read: the header said to copy the head's ``mlflow.db`` into the
    same ``runs/`` as the run folder, where the laptop's own runs (README's ``make demo``) keep
    theirs: the copy replaced it, and the local runs' MLflow records were gone. The header's copy
    commands, run as written (``cp`` standing in for rsync) on a laptop with a run of its own:
    both runs are read from MLflow after it."""
    laptop = tmp_path / "laptop"
    _, local_run = _tracked_job(laptop / "runs", "demo-graft", *_history())  # make demo, before the cluster
    head = tmp_path / "head" / "runs"
    name = "graft-pair-3b" if header.startswith("configs/") else "graft-run"
    _, cluster_run = _tracked_job(head, name, *_history())
    for source, target in _header_copies(ROOT / header, name):
        source, target = source.replace("<run.name>", name), target.replace("<run.name>", name)
        _rsync_down(head / Path(source).relative_to(HEAD_RUNS), laptop / target)
    shutil.rmtree(tmp_path / "head")  # ray down
    out = _report(local_run)
    assert "could not be read" not in out and "(metrics.jsonl)" not in out, out
    assert f"read from MLflow sqlite:///{(laptop / 'runs' / 'mlflow.db').resolve()})" in out, out
    out = _report(laptop / "runs" / name)
    assert "could not be read" not in out and "(metrics.jsonl)" not in out, out
    assert "read from MLflow sqlite:///" in out and not (tmp_path / "head").exists(), out
