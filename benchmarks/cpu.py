"""What this CPU offers bf16 (read from ``/proc/cpuinfo``; no torch import, so a report or a
test can ask cheaply)."""

from __future__ import annotations

import os
from pathlib import Path

BF16_HARDWARE = ("avx512_bf16", "amx_bf16")
"""CPU flags with which bf16 matmuls run in hardware; without them (and without a GPU) they are
emulated, slower than fp32 (on a 2-core AVX2 CPU TRL's shipped-defaults step on the 13.7 M
benchmark model took over 3 min)."""


def cpu_bf16_flags() -> list[str]:
    """The CPU's flags that matter for bf16 (amx_bf16, amx_tile, avx512_bf16, ...)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in flags.split(":", 1)[1].split() if "bf16" in f or f.startswith("amx"))


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot, all cores together (``/proc/stat``:
    user + nice + system + irq + softirq + steal; idle and iowait left out). Differences of it
    time a stretch of work with everything it caused: actors, Ray's own processes, the kernel's
    writeback. NaN where there is no ``/proc/stat``."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return float("nan")
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
