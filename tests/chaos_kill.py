"""The chaos test's killing side (``tests/chaos.py``): what a schedule of kills is, which
processes of a running controller can be killed, and the :class:`Killer` thread that waits for
each kill's stage (``Controller.stage``) and SIGKILLs one of them."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import ray

from tests.ray_instance import process_alive

if TYPE_CHECKING:
    from orchestrator.controller.loop import Controller


KINDS = ("trainer", "generator", "verifier", "math-child")
# the stages a kill is aimed at; start-up and export come once per run, the others every step
# (evaluation every other step; recovery after each death the controller recovers from)
TARGETS = ("start-up", "generate", "verify", "score", "train", "sync", "evaluation", "checkpoint", "upload",
           "recovery", "export")
# at most this long (s) after the stage began; stages of a few milliseconds get 0
MAX_DELAY = {"start-up": 4.0, "generate": 0.5, "train": 0.5, "evaluation": 0.5, "score": 0.2, "recovery": 0.3,
             "verify": 0.05}
# deaths noticed at once (the stage calls every actor of the kind), so a recovery follows
RECOVERING = ("generate", "score", "train", "sync")
# the order a step passes through them: a schedule's kills come in this order, so that several
# of them can hit one step and none waits for a stage the run no longer reaches
STEP_ORDER = ("generate", "verify", "score", "train", "sync", "evaluation", "checkpoint", "upload")


@dataclass(frozen=True)
class Kill:
    """One planned kill: when the controller is in ``stage`` (after ``delay_s``), a process of
    ``victim`` kind, the ``pick``-th fraction of those alive."""

    stage: str
    victim: str
    delay_s: float = 0.0
    pick: float = 0.0


def make_schedule(seed: int, stages: list[str], victims: list[str] | None = None) -> list[Kill]:
    """Kills at ``stages`` (start-up first, export last, the others in a step's order,
    :data:`STEP_ORDER`; a recovery kill right after a kill whose death is noticed at once), each
    of a random kind (``victims``: given), a random delay and a random one of its kind."""
    rng = random.Random(seed)
    middle = sorted((s for s in stages if s not in ("start-up", "export", "recovery")), key=STEP_ORDER.index)
    for _ in range(stages.count("recovery")):  # after a kill that starts a recovery
        at = next((i for i, s in enumerate(middle) if s in RECOVERING and (i + 1 == len(middle) or
                                                                          middle[i + 1] != "recovery")), None)
        if at is None:
            middle.insert(0, "generate")
            at = 0
        middle.insert(at + 1, "recovery")
    order = ["start-up"] * stages.count("start-up") + middle + ["export"] * stages.count("export")
    plan = []
    for i, stage in enumerate(order):
        if victims is not None:
            victim = victims[i]
        elif i + 1 < len(order) and order[i + 1] == "recovery":
            victim = rng.choice(("trainer", "generator"))  # a recovery long enough to kill in
        elif stage in ("start-up", "recovery"):
            # start-up: no math-verify child yet; recovery: a death the run itself must survive
            victim = rng.choice(("trainer", "generator", "verifier"))
        elif stage == "export":
            victim = "trainer"  # the only actors the export uses
        else:
            victim = rng.choice(KINDS)
        plan.append(Kill(stage, victim, round(rng.uniform(0, MAX_DELAY.get(stage, 0.0)), 3), rng.random()))
    return plan


def deal(seed: int, schedules: int, kills: int) -> list[list[str]]:
    """Stages for ``schedules`` runs of ``kills`` kills each, spread so that every stage of
    :data:`TARGETS` is aimed at about as often: each run starts (even) or ends (odd) with a kill,
    the others are dealt from a seeded cycle over the recurring stages."""
    rng = random.Random(seed)
    recurring = [s for s in TARGETS if s not in ("start-up", "export")]
    cycle: list[str] = []
    out = []
    for i in range(schedules):
        stages = ["start-up" if i % 2 == 0 else "export"]
        while len(stages) < kills:
            if not cycle:
                cycle = rng.sample(recurring, len(recurring))
            pick = next((s for s in cycle if s not in stages), cycle[0])
            cycle.remove(pick)
            stages.append(pick)
        out.append(stages)
    return out


# -- processes ----------------------------------------------------------------------------


def actor_pid(handle) -> int | None:
    """The pid of the actor's worker process, once Ray gave it one (also in ``__init__``)."""
    info = ray._private.state.state.actor_table(handle._actor_id.hex())
    if info.get("State") not in ("ALIVE", "PENDING_CREATION") or not info.get("Pid"):
        return None
    return int(info["Pid"])


def math_children(pid: int) -> list[int]:
    """The math-verify children of a verifier actor's process (``multiprocessing`` spawn
    children; not its resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if b"spawn_main" in cmdline:
            found.append(int(entry))
    return sorted(found)


def candidates(ctrl: Controller, kind: str) -> list[tuple[str, int]]:
    """(role as ``orchestrator.controller.faults.identify`` names it, pid) of each live process of
    ``kind``."""
    actors = getattr(ctrl, "actors", None) or {}
    verifier = getattr(ctrl, "verifier", None)
    handles: list[tuple[str, object]] = []
    if kind == "trainer":
        handles = [(f"trainer rank {r} of model {n}", t) for n, a in actors.items() for r, t in enumerate(a.trainers)]
    elif kind == "generator":
        handles = [(f"generation replica {i} of model {n}", g) for n, a in actors.items()
                   for i, g in enumerate(a.generators)]
    elif verifier is not None:
        handles = [(f"verifier actor {i}", v) for i, v in enumerate(verifier.actors)]
    out = []
    for role, handle in handles:
        try:
            pid = actor_pid(handle)
        except Exception:  # noqa: BLE001 - the GCS may be busy; not a candidate this time
            pid = None
        if pid is None:
            continue
        if kind == "math-child":
            out += [(f"math-verify child of {role}", child) for child in math_children(pid)]
        else:
            out.append((role, pid))
    return out


# -- the killer ---------------------------------------------------------------------------


@dataclass
class Killed:
    """A kill made: when, in which stage (planned and actual), whom."""

    planned: str
    stage: str
    victim: str
    role: str
    pid: int
    time: float
    outcome: str = ""  # recovered | absorbed | unnoticed (set by :func:`match`)
    noticed_in: str = ""
    recovery_s: float | None = None  # death noticed -> recovered (the controller's)
    kill_to_recovered_s: float | None = None


class Killer(threading.Thread):
    """Carries out a plan of :class:`Kill` against a running controller, until the plan is
    done or :meth:`halt` is called; ``killed`` lists what it did, ``skipped`` what it could not."""

    POLL_S = 0.002

    def __init__(self, ctrl: Controller, plan: list[Kill]):
        super().__init__(name="chaos-killer", daemon=True)
        self.ctrl, self.plan = ctrl, list(plan)
        self.killed: list[Killed] = []
        self.skipped: list[tuple[Kill, str]] = []
        self._halt = threading.Event()

    def halt(self) -> None:
        self._halt.set()
        self.join(30)

    def _over(self) -> bool:
        return self._halt.is_set() or self.ctrl.stage == "end"

    def _wait_for(self, stage: str, kind: str) -> list[tuple[str, int]] | None:
        """Wait until the controller is in ``stage``; returns the processes of ``kind`` found
        alive meanwhile (looked up every half second, so that a stage of a few milliseconds is
        not over before the kill), or None when the run is over."""
        found: list[tuple[str, int]] = []
        looked = 0.0
        while self.ctrl.stage != stage:
            if self._over():
                return None
            if time.monotonic() - looked > 0.5:
                found, looked = candidates(self.ctrl, kind), time.monotonic()
            self._halt.wait(self.POLL_S)
        return None if self._over() else found

    def run(self) -> None:
        for kill in self.plan:
            try:
                if not self._carry_out(kill):
                    break
            except Exception as exc:  # noqa: BLE001 - a killer that breaks must say so, not hang the run
                self.skipped.append((kill, f"killer error: {type(exc).__name__}: {exc}"))
        for kill in self.plan[len(self.killed) + len(self.skipped):]:
            self.skipped.append((kill, "not reached: the run ended first"))

    def _carry_out(self, kill: Kill) -> bool:
        delay = kill.delay_s
        for _ in range(2):  # the stage ended before the delay: at its next start, at once
            found = self._wait_for(kill.stage, kill.victim)
            if found is None:
                return False
            if delay and self._halt.wait(delay):
                return False
            if self.ctrl.stage == kill.stage or delay == 0:
                break
            delay = 0.0
        if delay or not all(process_alive(pid) for _, pid in found):
            found = []  # looked up again: some were replaced, or time went by
        deadline = time.monotonic() + 30  # start-up: the actors may not have a process yet
        while not (found := found or candidates(self.ctrl, kill.victim)):
            if self._over():
                return False
            if time.monotonic() > deadline:
                self.skipped.append((kill, f"no live {kill.victim} process in stage {self.ctrl.stage}"))
                return True
            self._halt.wait(0.01)
        role, pid = found[min(int(kill.pick * len(found)), len(found) - 1)]
        stage = self.ctrl.stage
        if stage == "end":
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            self.skipped.append((kill, f"{role} was gone already"))
            return True
        self.killed.append(Killed(kill.stage, stage, kill.victim, role, pid, time.time()))
        return True
