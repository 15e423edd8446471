"""CPU seconds per test, for issue #54's account of where the suite's time goes (a pytest plugin,
loaded by ``tests/conftest.py`` only when ``GRAFTPOOL_TEST_CPU`` names a file).

A test's wall time under ``make test`` says little about what it costs the machine: three pytest
processes share 2 cores there, so every test waits for the others' processes, and one that starts
many processes takes a bigger share. Its CPU time does: the user + system seconds, during the test
(setup, call and teardown), of the pytest process and every process below it (``/proc``), the
session's Ray instance and its actors included.

A parent's ``cutime`` does not hold its ended children's time here: the raylet reaps its workers
without waiting for them (an actor's seconds vanish from the tree when it ends). So a thread
samples every process of the tree every :data:`PERIOD_S` and keeps each one's last user + system
seconds, by pid and start time; a test's CPU is what every process seen gained from the test's
start to its end. Not counted: a process's last moments between its last sample and its end,
processes that lived less than a period, and processes outside the tree, such as a ``ray start``
head (it leaves its parent) and what it runs.

Each test appends one JSON line, ``{"test", "wall_s", "cpu_s"}``, to the file;
``python -m benchmarks.test_cpu FILE`` sums them by module.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from orchestrator.cluster.local_ray import descendants

TICK = os.sysconf("SC_CLK_TCK")
PERIOD_S = 0.5

Process = tuple[int, int]  # (pid, start time in ticks): a pid used again is another process


def tree_cpu(root: int) -> dict[Process, float]:
    """User + system seconds of ``root`` and of every live process below it, by process."""
    seconds: dict[Process, float] = {}
    for pid in descendants({root}):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # ended between the listing and the read
        seconds[(pid, int(fields[19]))] = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
    return seconds


class TreeSampler:
    """Every process of ``root``'s tree, last seen with how many CPU seconds (sampled by a thread)."""

    def __init__(self, root: int, period_s: float = PERIOD_S) -> None:
        self.root, self.period_s = root, period_s
        self.last: dict[Process, float] = {}
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._run, name="graftpool-cpu-sampler", daemon=True).start()

    def stop(self) -> None:
        """No more samples from the thread (``sample`` still answers)."""
        self.stopped.set()

    def sample(self) -> dict[Process, float]:
        """Sample now; every process seen so far, with its last seconds."""
        seen = tree_cpu(self.root)
        with self.lock:
            self.last.update(seen)
            return dict(self.last)

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            self.stopped.wait(self.period_s)


def gained(start: dict[Process, float], end: dict[Process, float]) -> float:
    """The CPU seconds every process gained from ``start`` to ``end`` (a new one: all of it)."""
    return sum(seconds - start.get(process, 0.0) for process, seconds in end.items())


class CpuAccount:
    """Writes each test's wall and CPU seconds to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sampler = TreeSampler(os.getpid())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        wall, start = time.monotonic(), self.sampler.sample()
        yield
        line = {"test": item.nodeid, "wall_s": round(time.monotonic() - wall, 2),
                "cpu_s": round(gained(start, self.sampler.sample()), 2)}
        with self.path.open("a") as f:
            f.write(json.dumps(line) + "\n")
