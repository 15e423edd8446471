"""A job stopped while its start-up rewrites the run folder's ``config.yaml`` (issue #51's
seventeenth read): the file was written in place, so a stop between its truncation and its write
left it empty or cut, and every later ``--resume`` was refused as a changed config ("the config
differs from .../config.yaml in algorithm.epochs, ..."). Now it is written under a temporary name
and renamed. The interrupted write is a real one: the resumed job runs in a process whose file-size
limit (``RLIMIT_FSIZE``) is below the config's size, so its write fails part-way, as a full disk's does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from orchestrator.config import dump_config, load_config
from orchestrator.controller.checkpoint import prepare_run_dir

ROOT = Path(__file__).resolve().parent.parent
RESUME = """
import resource, signal, sys
from orchestrator.config import load_config
from orchestrator.controller.loop import Controller
config = load_config(sys.argv[1], sys.argv[2:])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))
Controller(config).start()
"""


def test_a_start_whose_config_write_fails_part_way_leaves_the_run_folder_resumable(tmp_path):
    overrides = ["run.steps=3", f"run.output_dir={tmp_path}", "run.name=job", "run.resume=true"]
    config = load_config(ROOT / "configs" / "demo_pair.yaml", overrides)
    run_dir = tmp_path / "job"
    checkpoint = run_dir / "checkpoints" / "step_000001"
    checkpoint.mkdir(parents=True)
    (checkpoint / "controller.json").write_text(json.dumps({"step": 1}))
    (run_dir / "config.yaml").write_text(dump_config(config))
    before = (run_dir / "config.yaml").read_text()
    assert len(before) > 512
    done = subprocess.run([sys.executable, "-c", RESUME, str(ROOT / "configs" / "demo_pair.yaml"), *overrides],
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode != 0 and "File too large" in done.stderr, done.stderr[-2000:]
    assert (run_dir / "config.yaml").read_text() == before
    assert prepare_run_dir(run_dir, config) == checkpoint  # the next --resume is not refused
