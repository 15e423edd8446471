"""A generation replica's CPU priority: with ``run.async: one_step`` on CPU the replicas sample the
next batch while the trainers update on the same cores, and the update is the step's critical
path. Raising the replicas' niceness lets the update take the cores first and generation fill
what it leaves (the verifier, the routing, the weight sync, the driver's bookkeeping); measured
in ``make bench-async`` (``benchmarks/results/async.md``)."""

from __future__ import annotations

import os
from pathlib import Path


def lower_cpu_priority(nice: int) -> int:
    """Set every thread of this process to niceness ``nice`` (0-19; only ever lowering the
    priority, which needs no privilege) and return the main thread's niceness afterwards.

    On Linux niceness belongs to a thread, and a thread starts with its creator's: the threads
    running now are each set, and the ones torch starts later inherit it. Where there is no
    ``/proc/self/task`` the process's own call (``os.nice``) stands in."""
    if not 0 <= nice <= 19:
        raise ValueError(f"niceness must be 0..19 (higher is a lower priority), got {nice}")
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        for tid in os.listdir(tasks):
            try:
                if os.getpriority(os.PRIO_PROCESS, int(tid)) < nice:
                    os.setpriority(os.PRIO_PROCESS, int(tid), nice)
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
    elif hasattr(os, "nice"):
        os.nice(max(0, nice - os.nice(0)))
    return os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else nice
