"""``tests/cpu_accounting.py``: a test's CPU seconds count the processes below the pytest process,
while they run and after they ended, even where their parent never waits for them (as the raylet
reaps Ray's workers: an ended child's time is then in no parent's ``cutime``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.cpu_accounting import TreeSampler, gained

BURN = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass\n"


def test_a_childs_cpu_counts_after_it_ended_unwaited():
    sampler = TreeSampler(os.getpid(), period_s=0.1)
    start, reaped = sampler.sample(), os.times().children_user  # what earlier tests' waited children left
    before = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped unwaited, as the raylet's
    try:
        child = subprocess.Popen([sys.executable, "-c", BURN])
        deadline = time.monotonic() + 60
        while os.path.exists(f"/proc/{child.pid}") and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGCHLD, before)
        sampler.stop()  # its thread would scan /proc ten times a second for the rest of the session
    assert os.times().children_user - reaped < 0.5, "the child's time reached this process's cutime: not the case under test"
    assert gained(start, sampler.sample()) >= 0.8  # its last 0.1 s may fall between samples
