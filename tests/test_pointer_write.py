"""A job stopped while the tracker rewrites the run folder's ``mlflow.json`` (issue #51's fortieth
read, half a): the pointer was written in place, so a write cut part way (the job killed between its
truncation and its write, a full disk) left it cut; a resume then read no pointer and sent nothing
the killed job had left unsent, and ``dashboards report`` of the folder failed on it. Now it is
written under a temporary name and renamed. The cut write is a real one: a resumed job's tracker,
which first rewrites the killed job's pointer, runs in a process whose file-size limit
(``RLIMIT_FSIZE``) is below the pointer's size, so its write fails part way, as a full disk's does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from dashboards.tracking import Tracker

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 64  # bytes: below mlflow.json's size
RESUME = f"""
import json, resource, signal, sys
from pathlib import Path
from dashboards.tracking import Tracker
folder = Path(sys.argv[2])
earlier = json.loads((folder / "mlflow.json").read_text())
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, ({LIMIT}, {LIMIT}))
Tracker(sys.argv[1], "exp", "job", {{"run": {{"steps": 2}}}}, ["a"], folder, retry_after_s=0,
        resume={{**earlier, "step": 1}})
"""


def test_a_pointer_write_cut_part_way_leaves_the_earlier_pointer_whole(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    killed = Tracker(uri, "exp", "job", {"run": {"steps": 2}}, ["a"], tmp_path / "job", retry_after_s=0)
    killed.log(1, {"x": 0.1}, model="a")
    killed.finish("KILLED")
    pointer_path = tmp_path / "job" / "mlflow.json"
    earlier = pointer_path.read_text()
    assert len(earlier) > LIMIT and json.loads(earlier)["caught_up_step"] == 1
    done = subprocess.run([sys.executable, "-c", RESUME, uri, str(tmp_path / "job")], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-2000:]
    assert pointer_path.read_text() == earlier  # whole: the next resume reads it
