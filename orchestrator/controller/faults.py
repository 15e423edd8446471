"""Surviving actor deaths: recreate the actor, retry the work, or go back to a checkpoint.

* A generation replica or a verifier actor that dies is started again with the same
  arguments on the same placement-group bundle (a generation replica then gets its
  trainer's current weights and its last known RNG state; with the collective weight sync its
  model's other replicas are started again too, ``ModelActors.lost_with``), and the interrupted work is
  redone from its start: a step (its prompts, the policy's state and every replica's RNG
  state are put back first, so the retried step is the one an uninterrupted run makes), an
  evaluation, or the weight sync at the end of a step. Nothing of a failed step is written:
  the trajectory store and the metrics are written after its last actor call.
* A trainer rank that dies takes its model's other ranks with it (they may be stuck in a
  collective), as does one found dead when a replica's or verifier's death is noticed (a lost
  node); they are started again and every model's trainers, generation replicas and the
  controller go back to the newer of the latest checkpoint and the last step's
  snapshot (``orchestrator.controller.snapshot``), as a resume in the same process.
* An actor that dies while the run starts (its actors still loading, or a checkpoint being
  resumed) or while the run recovers from an earlier death is started again and that phase
  redone from its start (:func:`until_settled`); the other actors are kept (a trainer rank whose
  peers had not begun to form their process group is started again alone).
* An actor restarted before within ``run.restart_window_s`` waits :func:`backoff_s` first; the
  restarts per actor are counted (:func:`restarts`, MLflow :func:`restart_metric`).
* A death is what a call to the actor reports: Ray's error for a dead actor (SIGKILLed by the
  kernel's OOM killer or by anyone, its node lost), naming the actor, or the
  ``OutOfMemoryError`` of Ray's memory monitor, which names none (the actor Ray reports dead
  is taken, :func:`dead_actor_id`).
* ``run.max_step_retries`` deaths per step (and per evaluation) are survived, and
  ``run.max_restarts`` restarts of one actor within ``run.restart_window_s`` in any phase; the
  next death fails the run with :class:`ActorLost`: one line naming what died, in which phase,
  and how to resume.

Every death is an entry of ``RunState.faults`` (``summary.json``'s ``faults``): the step, the
phase (the work redone), the stage it was noticed in (``Controller.stage``), the actor, what
was done, when, and once the run is back where it was (the new actor ready with its state, or
the checkpoint loaded everywhere) ``recovery_s``. Each one, and each recovery, is also an event
on the run (``Tracker.log_fault``: MLflow metrics and a tag, ``faults.jsonl``), as is a death
that stops the run.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ray.exceptions import RayActorError

from orchestrator.cluster.actor_calls import DEATHS, get_all
from orchestrator.controller.checkpoint import latest_checkpoint, read_state, restore_checkpoint
from orchestrator.controller.death_cause import death_cause, death_line
from orchestrator.controller.node_layout import check_layout
from orchestrator.controller.run_state import load_replica_rng
from orchestrator.controller.snapshot import restore_snapshot_else
from orchestrator.controller.stop_line import ActorLost, next_step_hint, stop

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext

T = TypeVar("T")


@dataclass
class Fault:
    kind: str  # generator | trainer | verifier | unknown
    model: str | None
    index: int
    role: str  # "generation replica 0 of model llama-char", ...


class TrainerLost(Exception):
    """A trainer rank died during ``step``: the run goes back to the last checkpoint."""

    def __init__(self, fault: Fault, step: int, cause: BaseException):
        super().__init__(f"{fault.role} died at step {step} ({death_line(cause)})")
        self.fault, self.step, self.cause = fault, step, cause


def _handles(ctrl: RunContext) -> list:
    return [*(a for name in ctrl.names for a in (*ctrl.actors[name].generators, *ctrl.actors[name].trainers)),
            *ctrl.verifier.actors]


def dead_actor_id(ctrl: RunContext, wait_s: float = 10.0) -> str | None:
    """The id of one of the run's actors that Ray's GCS reports dead, waiting up to ``wait_s``
    for one: Ray's memory monitor kills a worker and raises an ``OutOfMemoryError`` that names
    no actor."""
    from ray._private.state import state

    deadline = time.monotonic() + wait_s
    while True:
        for handle in _handles(ctrl):
            try:
                if state.actor_table(handle._actor_id.hex()).get("State") == "DEAD":
                    return handle._actor_id.hex()
            except Exception:  # noqa: BLE001 - the GCS busy: look again
                pass
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def identify(ctrl: RunContext, exc: RayActorError) -> Fault:
    """Which of the controller's actors the error is about: by the actor id in the error, or,
    for an error that names none (an ``OutOfMemoryError``), the one Ray reports dead."""
    return _fault_of(ctrl, getattr(exc, "actor_id", None) or dead_actor_id(ctrl))


def _fault_of(ctrl: RunContext, actor_id: str | None) -> Fault:
    for name in ctrl.names:
        actors = ctrl.actors[name]
        for i, g in enumerate(actors.generators):
            if g._actor_id.hex() == actor_id:
                return Fault("generator", name, i, f"generation replica {i} of model {name}")
        for r, t in enumerate(actors.trainers):
            if t._actor_id.hex() == actor_id:
                return Fault("trainer", name, r, f"trainer rank {r} of model {name}")
    for i, v in enumerate(ctrl.verifier.actors):
        if v._actor_id.hex() == actor_id:
            return Fault("verifier", None, i, f"verifier actor {i}")
    return Fault("unknown", None, -1, f"actor {actor_id}")


def also_dead(ctrl: RunContext, known: Fault) -> list[Fault]:
    """The run's other actors that Ray's GCS reports dead now (besides ``known``): restarted
    with it, side by side, instead of one a pass."""
    from ray._private.state import state

    found = []
    for handle in _handles(ctrl):
        try:
            dead = state.actor_table(handle._actor_id.hex()).get("State") == "DEAD"
        except Exception:  # noqa: BLE001 - the GCS busy: its death is noticed at its next use
            dead = False
        if dead and (fault := _fault_of(ctrl, handle._actor_id.hex())).role != known.role:
            found.append(fault)
    return found


def _entry(ctrl: RunContext, step: int, fault: Fault, phase: str, action: str) -> dict:
    return {"step": step, "phase": phase, "stage": ctrl.stage, "actor": fault.role, "kind": fault.kind,
            "action": action, "time": time.time()}


def fatal(ctrl: RunContext, step: int, fault: Fault, phase: str, message: str) -> ActorLost:
    """The error that ends the run (:func:`stop`), its death logged as an event first."""
    error = stop(message, next_step_hint(ctrl))
    tracker = getattr(ctrl, "tracker", None)
    if tracker is not None:
        tracker.log_fault(step, {**_entry(ctrl, step, fault, phase, "stopped the run"), "error": str(error)})
    return error


def check_budget(ctrl: RunContext, fault: Fault, phase: str, exc: BaseException, step: int = 0) -> None:
    """Raise :class:`ActorLost` when ``fault``'s actor may not be started again: it is none of
    the run's, or it was restarted ``run.max_restarts`` times within ``run.restart_window_s``."""
    run = ctrl.config.run
    if fault.kind == "unknown":
        raise fatal(ctrl, step, fault, phase, f"{fault.role} died during {phase} ({death_line(exc)}); it is none "
                    "of the run's actors") from exc
    since = time.time() - run.restart_window_s
    restarts = sum(f["actor"] == fault.role and f["time"] >= since for f in ctrl.state.faults)
    if restarts >= run.max_restarts:
        raise fatal(ctrl, step, fault, phase, f"{fault.role} died during {phase} ({death_line(exc)}) after "
                    f"{restarts} restarts within {run.restart_window_s:g} s (run.max_restarts = {run.max_restarts}, "
                    f"run.restart_window_s = {run.restart_window_s:g}); stopping") from exc


def restarts(faults: list[dict]) -> dict[str, int]:
    """Per actor (its role), the deaths the run survived, each a restart of it (``summary.json``'s
    ``restarts``)."""
    out: dict[str, int] = {}
    for f in faults:
        if f.get("action") != "stopped the run":
            out[f["actor"]] = out.get(f["actor"], 0) + 1
    return out


def restart_metric(fault: Fault) -> str:
    """The MLflow metric counting ``fault``'s actor's restarts: ``faults/restarts/<model>/trainer_<rank>``,
    ``.../replica_<i>``, ``faults/restarts/verifier_<i>``."""
    kind = {"trainer": "trainer", "generator": "replica", "verifier": "verifier"}.get(fault.kind, "actor")
    return f"faults/restarts/{fault.model + '/' if fault.model else ''}{kind}_{fault.index}"


def record(ctrl: RunContext, step: int, fault: Fault, phase: str, action: str, exc: BaseException) -> dict:
    """A death to survive: within the restart budget, written to ``ctrl.state.faults`` (and to
    ``ctrl.state.recovering`` until :func:`recovered`), warned and logged, with the actor's restart
    count (:func:`restart_metric`)."""
    check_budget(ctrl, fault, phase, exc, step)
    entry = _entry(ctrl, step, fault, phase, action)
    ctrl.state.faults.append(entry)
    ctrl.state.recovering.append(entry)
    warnings.warn(f"step {step}, {phase} ({entry['stage']}): {fault.role} died ({death_cause(exc)}); {action}",
                  stacklevel=3)
    ctrl.tracker.log_fault(step, entry, deaths=len(ctrl.state.faults))
    ctrl.tracker.log(step, {restart_metric(fault): float(restarts(ctrl.state.faults)[fault.role])})
    return entry


BACKOFF_CAP_S = 60.0


def backoff_s(ctrl: RunContext, fault: Fault) -> float:
    """How long to wait before restarting ``fault``'s actor: 0 at its first death within
    ``run.restart_window_s``, else ``run.restart_backoff_s * 2**(k-1)`` for its k-th restart
    there (at most :data:`BACKOFF_CAP_S`): an actor that keeps dying is restarted ever more slowly."""
    run = ctrl.config.run
    since = time.time() - run.restart_window_s
    earlier = sum(f["actor"] == fault.role and f["time"] >= since for f in ctrl.state.faults) - 1
    return 0.0 if earlier <= 0 else min(run.restart_backoff_s * 2 ** (earlier - 1), BACKOFF_CAP_S)


def recovered(ctrl: RunContext) -> None:
    """The run is back where it was: every death not yet recovered from gets its
    ``recovery_s`` (from the death noticed to now), logged as an event."""
    now = time.time()
    for entry in ctrl.state.recovering:
        entry["recovery_s"] = round(now - entry["time"], 3)
        ctrl.tracker.log_fault(entry["step"], entry)
    ctrl.state.recovering = []


def recreate(ctrl: RunContext, faults: list[Fault]) -> None:
    """New actors in place of dead ones, nothing loaded into them yet, after the longest of their
    back-offs (:func:`backoff_s`): every one started, then the trainer ranks joined. A dead
    trainer rank: itself where its peers had not begun to form their process group, else every
    rank of its model (``ModelActors.restart_trainers``); a dead replica: with the collective
    weight sync once its model's replicas began a sync group, every one (``ModelActors.lost_with``)."""
    time.sleep(max(backoff_s(ctrl, f) for f in faults))
    for name in ctrl.names:
        actors = ctrl.actors[name]
        replicas = sorted({i for f in faults if f.kind == "generator" and f.model == name for i in actors.lost_with(f.index)})
        for index in replicas:
            actors.restart_generator(index)
        ranks = sorted({f.index for f in faults if f.kind == "trainer" and f.model == name})
        for rank in ranks if not (actors.joined or actors.forming) else ranks[:1]:
            actors.restart_trainers(rank, join=False)  # a group begun: every rank, once
    for f in faults:
        if f.kind == "verifier":
            ctrl.verifier.replace(f.index)
    for name in sorted({f.model for f in faults if f.kind == "trainer"}):
        ctrl.actors[name].join()


def until_settled(ctrl: RunContext, step: int, phase: str, work: Callable[[], T], dead: Fault | None = None) -> T:
    """``work()``, once ``dead`` (if given) is recreated. An actor of any kind that dies meanwhile
    is recreated, with every other actor found dead by then (:func:`also_dead`), and ``work``
    redone from its start, within the restart budget (:func:`check_budget`); ``work`` loads
    whatever new actors need (weights, RNG states)."""
    stage = ctrl.stage
    faults = [] if dead is None else [dead]
    while True:
        try:
            if faults:
                ctrl.stage = "recovery"
                recreate(ctrl, faults)
                faults = []
            ctrl.stage = stage
            result = work()
            recovered(ctrl)
            return result
        except DEATHS as exc:
            faults = [identify(ctrl, exc)]
            faults += also_dead(ctrl, faults[0])
            for fault in faults:
                record(ctrl, step, fault, phase, f"started it again and redid {phase}", exc)


def restart_generator(ctrl: RunContext, name: str, index: int) -> None:
    """A new replica with the weights the model's replicas hold (``ModelActors.reload_synced``: the
    last sync's; with the collective sync, the trainer's, to every replica) and the replica's last
    known RNG state (with the collective weight sync, every replica of the model:
    ``ModelActors.lost_with``)."""
    actors = ctrl.actors[name]
    indices = actors.lost_with(index)
    for i in indices:
        actors.restart_generator(i)
    get_all(actors.reload_synced(indices))
    get_all(actors.set_rng_states([ctrl.state.gen_rng[name][i] for i in indices], indices))
    ctrl.record_placement()


def with_retries(ctrl: RunContext, step: int, what: str, work: Callable[[], T],
                 before_retry: Callable[[], None] | None = None) -> T:
    """``work()``; when a generation replica or verifier actor dies: recreate it,
    ``before_retry()``, and again, at most ``run.max_step_retries`` times. A dead trainer
    raises :class:`TrainerLost`, also where a replica's or verifier's death is noticed first and a
    trainer rank is found dead with it (:func:`also_dead`): a lost node takes a model's replica and
    ranks together, and with rank 0 the only copy of the last sync's weights, which a replica
    restarted alone would reload."""
    failures = 0
    recover: Fault | None = None
    stage = ctrl.stage
    while True:
        try:
            if recover is not None:  # inside the try: a death while recovering counts too
                ctrl.stage = "recovery"
                time.sleep(backoff_s(ctrl, recover))
                if recover.kind == "generator":
                    restart_generator(ctrl, recover.model, recover.index)
                else:
                    ctrl.verifier.replace(recover.index)
                recover = None
                if before_retry is not None:
                    before_retry()
                recovered(ctrl)
                ctrl.stage = stage
            return work()
        except DEATHS as exc:
            fault = identify(ctrl, exc)
            if fault.kind != "trainer":
                # a lost node takes a model's replica and trainer ranks together, the replica's death
                # often noticed first; the last sync's weights (rank 0's object, on that node) went too
                fault = next((f for f in also_dead(ctrl, fault) if f.kind == "trainer"), fault)
            if fault.kind == "trainer":
                raise TrainerLost(fault, step, exc) from exc
            failures += 1
            if fault.kind == "unknown" or failures > ctrl.config.run.max_step_retries:
                raise fatal(ctrl, step, fault, what, f"{what}: {fault.role} died ({death_line(exc)}); giving up "
                            f"after {failures - 1} retries (run.max_step_retries = "
                            f"{ctrl.config.run.max_step_retries})") from exc
            record(ctrl, step, fault, what, f"recreated it and retried {what}", exc)
            recover = fault


def rollout_snapshot(ctrl: RunContext) -> Callable[[], None]:
    """What a retried step or evaluation must start from again: the generation replicas' RNG
    states, the prompt cursor and the policy's state. Returns the function that puts it back."""
    put_back = ctrl.state.rollout_snapshot()

    def restore() -> None:
        load_replica_rng(ctrl, put_back())

    return restore


def recover_trainer(ctrl: RunContext, lost: TrainerLost, failures: dict[int, int]) -> int:
    """Restart the dead trainer's model's ranks and go back to the newest of the latest checkpoint
    and the last step's snapshot (``orchestrator.controller.snapshot``; one lost with its node gives
    way to the checkpoint, or stops the run where there is none); an actor that dies
    meanwhile is recreated and the recovery redone (:func:`until_settled`). Returns the step gone
    back to."""
    failures[lost.step] = failures.get(lost.step, 0) + 1
    run = ctrl.config.run
    limit = run.max_step_retries
    phase = f"step {lost.step}"
    if failures[lost.step] > limit:
        raise fatal(ctrl, lost.step, lost.fault, phase, f"{lost}; giving up after {limit} recoveries at this step "
                    f"(run.max_step_retries = {limit})") from lost.cause
    folder = latest_checkpoint(ctrl.run_dir)
    snapshot = ctrl.state.snapshot
    newer = snapshot is not None and (folder is None or snapshot.step > read_state(folder)["step"])
    if not newer and folder is None:
        raise fatal(ctrl, lost.step, lost.fault, phase, f"{lost}; there is no checkpoint or step snapshot to restore "
                    f"it from (run.checkpoint_every = {run.checkpoint_every}, run.step_snapshot = "
                    f"{run.step_snapshot})") from lost.cause
    back_to = f"the snapshot of step {snapshot.step}" if newer else f"checkpoint {folder.name}"
    entry = record(ctrl, lost.step, lost.fault, phase, f"restarted model {lost.fault.model}'s trainers "
                   f"and went back to {back_to}", lost.cause)

    def go_back() -> int:  # a snapshot lost with its node: the checkpoint, or the run stopped
        if not newer:
            return restore_checkpoint(ctrl, folder)
        return restore_snapshot_else(ctrl, snapshot, folder, entry,
                                     lambda why: fatal(ctrl, lost.step, lost.fault, phase, f"{lost}; {why}"))

    ctrl.stage = "recovery"
    step = until_settled(ctrl, lost.step, f"recovery from the loss of {lost.fault.role}",
                         lambda: _go_back(ctrl, go_back, lost.fault.model), dead=lost.fault)
    ctrl.tracker.mark_resume(step)
    return step


def _go_back(ctrl: RunContext, restore: Callable[[], int], model: str) -> int:
    ctrl.record_placement()
    check_layout(ctrl, [model])  # the model's new ranks may sit on other nodes
    return restore()


__all__ = ["ActorLost", "Fault", "TrainerLost", "backoff_s", "check_budget", "fatal", "identify", "record", "recover_trainer",
           "recovered", "recreate", "restart_generator", "restart_metric", "restarts", "rollout_snapshot", "stop", "until_settled", "with_retries"]
