"""``graftpool serve``'s process: deploy a run's models (:func:`orchestrator.serving.serve.start_serving`)
and serve until stopped, then take the deployments down."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from ray import serve

from orchestrator.serving.serve import start_serving

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""What ends a serve besides Ctrl-C: ``ray job stop`` (SIGTERM, then SIGKILL 3 s later) and a closed
shell session on the head (SIGHUP; a SIGHUP ignored, as under ``nohup``, stays ignored)."""


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _on_stop_signals() -> None:
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _interrupt)


def serve_forever(run_dir: Path, port: int = 8000) -> int:
    """Serve until Ctrl-C, SIGTERM or SIGHUP (:data:`STOP_SIGNALS`), then take Serve down. On a
    cluster Serve's applications outlive the process that deployed them (its controller is a
    detached actor), so without this a stopped serve job's deployments went on holding their GPUs
    and answering. A stop while the models deploy takes them down too: ``ray.init`` replaces the
    SIGTERM handler with its own (``sys.exit``) until :func:`start_serving` returns."""
    import ray

    _on_stop_signals()
    try:
        url = start_serving(run_dir, port)
        _on_stop_signals()  # ours again, over ray.init's
        print(f"serving {run_dir} at {url} (OpenAI-compatible, GET {url}/models lists the models; Ctrl-C, "
              "SIGTERM (`ray job stop`) or SIGHUP stops it and takes its deployments down)", flush=True)
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        if ray.is_initialized():
            serve.shutdown()  # asks Serve's controller first: it goes on if this process is killed meanwhile
    return 0
