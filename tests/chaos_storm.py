"""Chaos from start-up (``make chaos CHAOS_EVERY=3``): the demo pair's run
(``tests/reference_run.py``) with a SIGKILL of a random trainer rank or generation replica every
``every`` seconds from the moment the job starts, start-up included, ``kills`` of them (0: until
the run ends), and the check that it ends as the uninterrupted run did (``assert_same_run``:
store, evaluation files, pass@1, metrics, final weights).

The kills are real ``SIGKILL``s of the actors' processes (pid from Ray's GCS, an actor still in its
``__init__`` included), as in ``tests/chaos.py``; the retry bounds are raised and the back-off
is off (``SETTINGS``) so that the run is stopped by nothing but its own end. Reported: the kills, the restarts per actor
(``summary.json``'s ``restarts``), the wall time, and whether the run equals the reference.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.config import load_config
from tests.chaos import KillerAtItsSide, StageClock, match
from tests.chaos_kill import Killed, candidates
from tests.reference_run import DEMO, PAIR, assert_same_run, overrides

# a kill every few seconds restarts each actor many times: bounds the run does not reach, and no
# back-off (the kills are this test's, not an actor that keeps failing; a back-off of seconds per
# restart would only lengthen the run)
SETTINGS = ["run.max_step_retries=50", "run.max_restarts=50", "run.restart_backoff_s=0"]


class IntervalKiller(threading.Thread):
    """SIGKILLs a random live trainer rank or generation replica of ``ctrl`` every ``every_s``
    seconds from :meth:`start` on, ``kills`` times (0: until :meth:`halt` or the run's end)."""

    def __init__(self, ctrl, every_s: float, kills: int, seed: int):
        super().__init__(name="chaos-storm", daemon=True)
        self.ctrl, self.every_s, self.kills = ctrl, every_s, kills
        self.rng = random.Random(seed)
        self.killed: list[Killed] = []
        self.missed = 0  # ticks with no live process to kill (the run between actors)
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()
        self.join(30)

    def run(self) -> None:
        while not self._halt.wait(self.every_s):
            stage = getattr(self.ctrl, "stage", "")
            if stage == "end" or (self.kills and len(self.killed) >= self.kills):
                return
            found = [(kind, role, pid) for kind in ("trainer", "generator")
                     for role, pid in candidates(self.ctrl, kind)]
            if not found:
                self.missed += 1
                continue
            kind, role, pid = self.rng.choice(found)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                self.missed += 1
                continue
            self.killed.append(Killed("every", stage, kind, role, pid, time.time()))


@dataclass
class StormResult:
    every_s: float
    kills: list[Killed] = field(default_factory=list)
    missed: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    wall_s: float = 0.0
    same: bool | None = None
    error: str = ""

    def text(self) -> str:
        stages = sorted({k.stage for k in self.kills})
        lines = [f"kill every {self.every_s:g} s from start-up: {len(self.kills)} kills "
                 f"({sum(k.stage == 'start-up' for k in self.kills)} in start-up; stages hit: {', '.join(stages)}), "
                 f"{self.missed} ticks with no live actor, {self.steps} steps, {self.wall_s:.1f} s, "
                 + ("store, evals, pass@1, metrics and final weights equal to the reference" if self.same
                    else f"NOT equal to the reference: {self.error}"),
                 "restarts per actor: " + (", ".join(f"{a}: {n}" for a, n in sorted(self.restarts.items())) or "none")]
        return "\n".join(lines)


def storm_run(out: Path, name: str, every_s: float, kills: int, seed: int, reference: Path | None) -> StormResult:
    """The reference's run in ``out/name`` under an :class:`IntervalKiller`; compared with
    ``reference`` when given."""
    from orchestrator.controller.loop import Controller

    class StormController(KillerAtItsSide, StageClock, Controller):
        """The demo pair's controller with an :class:`IntervalKiller` at its side."""

    ctrl = StormController(load_config(DEMO, overrides(out, name, [*PAIR, *SETTINGS])))
    ctrl.killer = IntervalKiller(ctrl, every_s, kills, seed)
    result = StormResult(every_s)
    t0 = time.monotonic()
    try:
        summary = ctrl.run()
        result.restarts, result.steps = summary["restarts"], summary["steps"]
    except Exception as exc:  # noqa: BLE001 - reported, and the caller fails
        result.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        state = getattr(ctrl, "state", None)
        if state is not None:
            from orchestrator.controller.faults import restarts

            result.restarts, result.steps = restarts(state.faults), len(state.history)
    finally:
        ctrl.killer.halt()
    result.wall_s = round(time.monotonic() - t0, 1)
    result.kills, result.missed = ctrl.killer.killed, ctrl.killer.missed
    state = getattr(ctrl, "state", None)
    match(result.kills, list(state.faults) if state is not None else [])
    if reference is not None and not result.error:
        try:
            assert_same_run(out / name, reference)
            result.same = True
        except AssertionError as exc:
            result.same, result.error = False, f"differs from the reference: {str(exc)[:300]}"
    return result
