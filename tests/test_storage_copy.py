"""A file copied to a path ``run.storage`` is there whole or not at all (issue #51's sixteenth read).

A checkpoint copies the run's records (``metrics.jsonl``, ``faults.jsonl``, ``flow_matrix.json``) to
``run.storage`` before the checkpoint itself, and each store and evaluation file as it is written.
To a folder (a local or NFS path, ``file://``) the copy was written in place, so a job stopped
during it left the file cut short beside the previous checkpoint; a job resumed from that storage
on a new head downloaded it and failed (``json.loads`` of a cut ``flow_matrix.json`` in the
checkpoint's restore, at every later resume too). Here a real process copying a large file with
:meth:`RunStorage.upload` is SIGKILLed once the copy has begun: the file's name in storage holds
the earlier version, never a part of the new one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.controller.run_storage import RunStorage

ROOT = Path(__file__).resolve().parent.parent
BIG = 1 << 30  # long enough to copy that the kill lands during the copy

UPLOAD = """
import sys
from pathlib import Path
from orchestrator.controller.run_storage import RunStorage
RunStorage(sys.argv[1], "run", Path(sys.argv[2])).mirror(Path(sys.argv[2]) / "flow_matrix.json")
"""



def _kill_once_bytes_land(script: str, store: Path, run_dir: Path, landed) -> None:
    """Run ``script`` (a copy between ``file://<store>`` and ``run_dir``) in a real process and
    SIGKILL it as soon as ``landed()`` says its bytes have begun to land; fails if it ended first."""
    proc = subprocess.Popen([sys.executable, "-c", script, f"file://{store}", str(run_dir)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        while proc.poll() is None and not landed():
            time.sleep(0.001)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "the copy ended before the kill: make BIG larger"

def test_a_copy_to_a_path_storage_stopped_part_way_leaves_the_earlier_file_whole(tmp_path):
    run_dir, store = tmp_path / "run", tmp_path / "store"
    run_dir.mkdir()
    earlier = b'{"steps": []}\n'
    (run_dir / "flow_matrix.json").write_bytes(earlier)
    RunStorage(f"file://{store}", "run", run_dir).mirror(run_dir / "flow_matrix.json")
    with open(run_dir / "flow_matrix.json", "wb") as f:  # the new version: 1 GiB, sparse on disk
        f.truncate(BIG)
    folder = store / "run"
    _kill_once_bytes_land(UPLOAD, store, run_dir, lambda: sum(p.stat().st_size for p in folder.iterdir()) > len(earlier))
    assert (folder / "flow_matrix.json").read_bytes() == earlier


DOWNLOAD = """
import sys
from pathlib import Path
from orchestrator.controller.run_storage import RunStorage
RunStorage(sys.argv[1], "run", Path(sys.argv[2])).download("trajectories/step_000001.parquet",
                                                            Path(sys.argv[2]) / "trajectories" / "step_000001.parquet")
"""


def test_a_download_from_storage_stopped_part_way_leaves_no_step_file(tmp_path):
    """A job resumed on a new head downloads the store's step files from ``run.storage`` before the
    checkpoint (issue #51's thirty-eighth read). A download stopped part way (the job stopped, the
    head lost) left a cut ``step_NNNNNN.parquet`` in the run folder, which every reader of the store
    opened (``ArrowInvalid``) until a later resume downloaded it again; the copy goes under a hidden
    name, renamed once whole. Here a real process downloading a large file is SIGKILLed once the
    copy has begun."""
    run_dir, store = tmp_path / "run", tmp_path / "store"
    (store / "run" / "trajectories").mkdir(parents=True)
    with open(store / "run" / "trajectories" / "step_000001.parquet", "wb") as f:  # 1 GiB, sparse
        f.truncate(BIG)
    folder = run_dir / "trajectories"
    _kill_once_bytes_land(DOWNLOAD, store, run_dir,
                          lambda: folder.is_dir() and any(p.stat().st_size for p in folder.iterdir()))
    assert sorted(p.name for p in folder.glob("step_*")) == []
