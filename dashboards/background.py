"""MLflow logging off the step's critical path (``tracking.background``).

A step ends with its bookkeeping: a few hundred metric values to ``metrics.jsonl`` and MLflow,
the flow matrix, plots at an evaluation. With a SQLite or HTTP store that is 25-50 ms of the
driver's time a step on the demo pair, during which no actor works. :class:`BackgroundTracker`
runs those calls on one thread of the driver, in the order they were made, while the next step
starts; what a caller reads from the tracker (its run ids, its flows) waits for them first, so it
is never behind the calls made before the read. MLflow's own asynchronous logging
(``synchronous=False``) queues its metric calls alike; this wrapper keeps the tracker's local
copy, retry and replay as they are, and queues its files and tags too.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from dashboards.tracking import Tracker

QUEUED = frozenset({"log", "log_fault", "mark_resume", "log_artifact", "log_flow"})
"""The tracker's calls that return nothing and only write: these go to the background thread."""


class BackgroundTracker:
    """A :class:`~dashboards.tracking.Tracker` whose writing calls (:data:`QUEUED`) run in order on
    one background thread; their arguments are copied when the call is made, so a caller may
    change a dict it logged. Reading or setting any other attribute first waits for every queued
    call (:meth:`drain`), as does :meth:`finish`, which then ends the runs in the caller's thread
    and stops the thread. An exception of a queued call is raised in the caller's thread by the
    next call, read or drain (the tracker itself turns tracking failures into warnings; what
    is left are local-file errors such as a full disk)."""

    def __init__(self, tracker: Tracker) -> None:
        self._bg_tracker = tracker
        self._bg_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="graftpool-tracking")
        self._bg_calls: list[Future] = []

    def __getattr__(self, name: str) -> Any:
        if name in QUEUED:
            method = getattr(self._bg_tracker, name)

            def queued(*args: Any, **kwargs: Any) -> None:
                self._bg_raise_failed()
                args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
                self._bg_calls.append(self._bg_thread.submit(method, *args, **kwargs))

            return queued
        self.drain()
        return getattr(self._bg_tracker, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_bg_"):
            object.__setattr__(self, name, value)
            return
        self.drain()
        setattr(self._bg_tracker, name, value)

    def drain(self) -> None:
        """Wait for every queued call, then raise the first one's exception, if any raised: a
        failure never leaves calls running behind the caller's next use of the tracker."""
        calls, self._bg_calls = self._bg_calls, []
        wait(calls)
        for call in calls:
            call.result()

    def finish(self, status: str = "FINISHED") -> None:
        """Every queued call, then the tracker's own ``finish`` (its last flush and the runs' end
        status); the thread stops. The runs are ended even when a queued call failed."""
        try:
            self.drain()
        finally:
            self._bg_tracker.finish(status)
            self._bg_thread.shutdown(wait=True)

    def _bg_raise_failed(self) -> None:
        """Raise the exception of a queued call that has ended with one; forget the ended calls."""
        running: list[Future] = []
        ended: list[Future] = []
        for call in self._bg_calls:
            (ended if call.done() else running).append(call)
        self._bg_calls = running
        for call in ended:
            call.result()
