"""Stopping a Ray instance that a test started with ``ray start --temp-dir``, and nothing else."""

from __future__ import annotations

import os
import signal
import time

from orchestrator.cluster.local_ray import instance_pids


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def stop_instance(temp_dir: str, grace_s: float = 2.0) -> set[int]:
    """Stop the instance of ``temp_dir`` and nothing else (``ray stop`` stops every Ray
    process of the machine): SIGTERM, then SIGKILL after ``grace_s``. The grace is short:
    gcs_server, the autoscaler monitor and the agents of a ``ray start --head`` instance
    outlive SIGTERM by more than 10 s (measured with Ray 2.60), so a longer one only waits.
    The set is taken first: workers lose their raylet parent.
    Returns the processes still alive after that (none, unless one is stuck in the kernel)."""
    pids = instance_pids(temp_dir)

    def alive() -> set[int]:
        return {pid for pid in pids if process_alive(pid)}

    def signal_all(sig: signal.Signals) -> None:
        for pid in alive():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and alive():
        time.sleep(0.2)
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and alive():
        time.sleep(0.1)
    return alive()
