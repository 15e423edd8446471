"""Where a step's time goes, phase by phase (``Controller.step``; issue #54).

A phase is opened with :meth:`PhaseClock.phase`: the run's stage (``ctx.stage``, which faults
record) becomes the phase's name, and its wall time is added to ``timings[name]`` where the
name is a timed one. A phase opened inside another (the compatibility pass inside routing)
counts as itself and not as its parent:

    timings[parent] = wall(parent) - sum(wall(child) for each child phase)

:meth:`PhaseClock.count_as` moves time that an actor measured inside the open phase (the
scoring inside each trainer's ``train``) to another phase. A phase left by an exception leaves
the stage where it was raised (the fault is recorded there) and times nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol


class HasStage(Protocol):
    stage: str


class PhaseClock:
    """One step's phase timings (``timed``: the names measured; other phases set the stage only;
    ``now``: the clock read, in seconds)."""

    def __init__(self, ctx: HasStage, timed: Sequence[str], now: Callable[[], float] = time.perf_counter):
        self.ctx = ctx
        self.now = now
        self.timings = dict.fromkeys(timed, 0.0)
        self._open: list[str] = []

    def _add(self, name: str, seconds: float) -> None:
        if name in self.timings:
            self.timings[name] += seconds

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """The stage is ``name`` while the block runs, and its time counted as ``name``'s."""
        self._open.append(name)
        self.ctx.stage = name
        t0 = self.now()
        try:
            yield
        except BaseException:
            self._open.pop()  # the stage stays ``name``: where the step stopped
            raise
        spent = self.now() - t0
        self._open.pop()
        self._add(name, spent)
        if self._open:  # back in the parent phase, which does not count this one
            self._add(self._open[-1], -spent)
            self.ctx.stage = self._open[-1]

    def count_as(self, name: str, seconds: float) -> None:
        """``seconds`` of the open phase counted as ``name``'s instead."""
        self._add(self._open[-1], -seconds)
        self._add(name, seconds)
