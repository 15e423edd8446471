"""The per-answer limit of a verifier's child process (``data.verifier_timeout_s``), on the
child's CPU time, not the wall clock.

On a busy node more children judge at once than there are cores (the GPU template's 16
verifier actors on the head's 8), so an answer's wall-clock time is its CPU time times however
long the child waits for a core; a wall-clock limit would fail a correct answer for the wait.
So the parent reads the child's CPU time (user + system, ``/proc/<pid>/stat``, in clock ticks:
10 ms) while it waits for the child's next result, and gives up when the child has spent
``limit_s`` of CPU time on the answer: what a sympy expression that never finishes does, at
any load. A backstop on the wall clock, ``WALL_FACTOR`` x ``limit_s`` (10 x: 20 s for the
default 2 s), catches a child that makes no progress at all (stopped, or starved for that
long). Where ``/proc`` is missing (macOS) the CPU time reads as the wall-clock time: the limit
is the wall clock's, as before. The reasons, "timeout after Xs" (CPU) and "timeout after Ys
wall clock", both start with :data:`workers.verify.verifier.TIMEOUT` (``verify/timeouts``).
"""

from __future__ import annotations

import os
import time
from multiprocessing.connection import Connection
from pathlib import Path

WALL_FACTOR = 10.0
"""The wall-clock backstop, in multiples of the CPU-time limit."""

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat`` fields 14 and
    15), None where it cannot be read."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name: field 3 (state) onwards
    return (int(fields[11]) + int(fields[12])) / _TICKS


def wait_result(conn: Connection, pid: int, limit_s: float) -> str | None:
    """Wait for the next result of child ``pid`` on ``conn``: None when it is there (or the
    pipe closed: the caller's recv says so); else the timeout's reason, when the child has
    used ``limit_s`` of CPU time since this call, or ``WALL_FACTOR * limit_s`` of wall-clock
    time has passed. The wait between reads is what is left of the CPU budget, which a child
    cannot spend in less wall-clock time (one thread)."""
    start = time.monotonic()
    cpu_start = cpu_seconds(pid)
    backstop = WALL_FACTOR * limit_s
    while True:
        elapsed = time.monotonic() - start
        cpu_now = cpu_seconds(pid) if cpu_start is not None else None
        used = elapsed if cpu_now is None or cpu_start is None else cpu_now - cpu_start
        if used >= limit_s:
            return None if conn.poll(0) else f"timeout after {limit_s:g}s"
        if elapsed >= backstop:
            return None if conn.poll(0) else f"timeout after {backstop:g}s wall clock"
        if conn.poll(min(limit_s - used, backstop - elapsed)):
            return None
