"""``tests/cpu_accounting.py``: a test's CPU seconds count its processes' children, those still
running and those that ended (through the ``cutime`` of the parent that reaped them)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.cpu_accounting import tree_cpu_s

BURN = "import time\nend = time.process_time() + 0.6\nwhile time.process_time() < end: pass\n"


def test_a_childs_cpu_counts_while_it_runs_and_after_it_ended():
    before = tree_cpu_s(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        while tree_cpu_s(os.getpid()) - before < 0.6:  # running: its own utime, read from /proc
            assert child.poll() is None
    finally:
        child.communicate(b"")
    ended = tree_cpu_s(os.getpid()) - before  # reaped: in this process's cutime
    assert ended >= 0.6, ended
    subprocess.run([sys.executable, "-c", BURN], check=True)
    assert tree_cpu_s(os.getpid()) - before >= ended + 0.6
