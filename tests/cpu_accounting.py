"""CPU seconds per test, for issue #54's account of where the suite's time goes (a pytest plugin,
loaded by ``tests/conftest.py`` only when ``GRAFTPOOL_TEST_CPU`` names a file).

A test's wall time under ``make test`` says little about what it costs the machine: three pytest
processes share 2 cores there, so every test waits for the others' processes, and one that starts
many processes takes a bigger share. Its CPU time does: the user + system seconds, during the test
(setup, call and teardown), of the pytest process and every process below it (``/proc``), the
session's Ray instance and its actors included. A process that ended during the test counts
through its parent's ``cutime`` / ``cstime`` (what a parent learns of the children it reaped: a Ray
worker's, the raylet's). Not counted: processes outside the tree, such as a ``ray start`` head
(it leaves its parent) and what it runs.

Each test appends one JSON line, ``{"test", "wall_s", "cpu_s"}``, to the file;
``python -m benchmarks.test_cpu FILE`` sums them by module.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.cluster.local_ray import descendants

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_s(root: int) -> float:
    """User + system seconds of ``root`` and every live process below it, with what each of them
    learnt of the children it reaped."""
    total = 0
    for pid in descendants({root}):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended between the listing and the read: its parent's cutime has it next time
        total += sum(int(v) for v in fields[11:15])  # utime, stime, cutime, cstime
    return total / TICK


class CpuAccount:
    """Writes each test's wall and CPU seconds to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, cpu = time.monotonic(), tree_cpu_s(os.getpid())
        yield
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 2),
                "cpu_s": round(tree_cpu_s(os.getpid()) - cpu, 2)}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
