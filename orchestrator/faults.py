"""Surviving actor deaths: recreate the actor, retry the work, or go back to a checkpoint.

* A generation replica or a verifier actor that dies is started again with the same
  arguments on the same placement-group bundle (a generation replica then gets its
  trainer's current weights and its last known RNG state), and the interrupted work is
  redone from its start: a step (its prompts, the policy's state and every replica's RNG
  state are put back first, so the retried step is the one an uninterrupted run makes), an
  evaluation, or the weight sync at the end of a step. Nothing of a failed step is written:
  the trajectory store and the metrics are written after its last actor call.
* A trainer rank that dies takes its model's other ranks with it (they may be stuck in a
  collective); they are started again and every model's trainers, generation replicas
  and the controller go back to the latest checkpoint, as a resume in the same process.
* ``run.max_step_retries`` deaths per step (and per evaluation) are survived; the next one
  fails the run with :class:`ActorLost`, naming what died.
"""

from __future__ import annotations

import copy
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ray.exceptions import RayActorError

from orchestrator.actors import get_all
from orchestrator.checkpoint import latest_checkpoint, restore_checkpoint

if TYPE_CHECKING:
    from orchestrator.loop import Controller

T = TypeVar("T")


class ActorLost(RuntimeError):
    """An actor died and the run could not go on (retries spent, or no checkpoint)."""


@dataclass
class Fault:
    kind: str  # generator | trainer | verifier | unknown
    model: str | None
    index: int
    role: str  # "generation replica 0 of model llama-char", ...


class TrainerLost(Exception):
    """A trainer rank died during ``step``: the run goes back to the last checkpoint."""

    def __init__(self, fault: Fault, step: int, cause: BaseException):
        super().__init__(f"{fault.role} died at step {step} ({_first_line(cause)})")
        self.fault, self.step, self.cause = fault, step, cause


def identify(ctrl: Controller, exc: RayActorError) -> Fault:
    """Which of the controller's actors the error is about (by actor id)."""
    actor_id = getattr(exc, "actor_id", None)
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


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def record(ctrl: Controller, step: int, fault: Fault, action: str, exc: BaseException) -> None:
    entry = {"step": step, "actor": fault.role, "kind": fault.kind, "action": action, "time": time.time()}
    ctrl.faults.append(entry)
    warnings.warn(f"step {step}: {fault.role} died ({type(exc).__name__}); {action}", stacklevel=3)
    ctrl.tracker.log(step, {f"faults/{fault.kind}": 1.0})


def restart_generator(ctrl: Controller, name: str, index: int) -> None:
    """A new replica with its trainer's current weights and the replica's last known RNG state."""
    actors = ctrl.actors[name]
    new = actors.restart_generator(index)
    get_all(actors.sync_weights([new]))
    get_all([new.set_rng_state.remote(ctrl.gen_rng[name][index])])
    ctrl.record_placement()


def with_retries(ctrl: Controller, step: int, what: str, work: Callable[[], T],
                 before_retry: Callable[[], None] | None = None) -> T:
    """``work()``; when a generation replica or verifier actor dies: recreate it,
    ``before_retry()``, and again, at most ``run.max_step_retries`` times. A dead trainer
    raises :class:`TrainerLost`."""
    failures = 0
    recover: Fault | None = None
    while True:
        try:
            if recover is not None:  # inside the try: a death while recovering counts too
                if recover.kind == "generator":
                    restart_generator(ctrl, recover.model, recover.index)
                else:
                    ctrl.verifier.replace(recover.index)
                recover = None
                if before_retry is not None:
                    before_retry()
            return work()
        except RayActorError as exc:
            fault = identify(ctrl, exc)
            if fault.kind == "trainer":
                raise TrainerLost(fault, step, exc) from exc
            failures += 1
            if fault.kind == "unknown" or failures > ctrl.config.run.max_step_retries:
                raise ActorLost(f"{what}: {fault.role} died ({_first_line(exc)}); giving up after "
                                f"{failures - 1} retries (run.max_step_retries = "
                                f"{ctrl.config.run.max_step_retries})") from exc
            record(ctrl, step, fault, f"recreated it and retried {what}", exc)
            recover = fault


def rollout_snapshot(ctrl: Controller) -> Callable[[], None]:
    """What a retried step or evaluation must start from again: the generation replicas' RNG
    states, the prompt cursor and the policy's state. Returns the function that puts it back."""
    gen_rng = {name: list(states) for name, states in ctrl.gen_rng.items()}
    sampler = ctrl.sampler.state_dict()
    policy = copy.deepcopy(ctrl.policy.state_dict())

    def restore() -> None:
        ctrl.sampler.load_state_dict(sampler)
        ctrl.policy.load_state_dict(copy.deepcopy(policy))
        ctrl.gen_rng = {name: list(states) for name, states in gen_rng.items()}
        get_all([ref for name in ctrl.names for ref in ctrl.actors[name].set_rng_states(ctrl.gen_rng[name])])

    return restore


def recover_trainer(ctrl: Controller, lost: TrainerLost, failures: dict[int, int]) -> int:
    """Restart the dead trainer's model's ranks and go back to the latest checkpoint;
    returns the checkpoint's step."""
    failures[lost.step] = failures.get(lost.step, 0) + 1
    limit = ctrl.config.run.max_step_retries
    if failures[lost.step] > limit:
        raise ActorLost(f"{lost}; giving up after {limit} recoveries at this step "
                        f"(run.max_step_retries = {limit})") from lost.cause
    folder = latest_checkpoint(ctrl.run_dir)
    if folder is None:
        raise ActorLost(f"{lost}; there is no checkpoint to restore it from (run.checkpoint_every = "
                        f"{ctrl.config.run.checkpoint_every})") from lost.cause
    record(ctrl, lost.step, lost.fault, f"restarted model {lost.fault.model}'s trainers and went back "
           f"to checkpoint {folder.name}", lost.cause)
    ctrl.actors[lost.fault.model].restart_trainers()
    ctrl.record_placement()
    step = restore_checkpoint(ctrl, folder)
    ctrl.tracker.mark_resume(step)
    return step


__all__ = ["ActorLost", "Fault", "TrainerLost", "identify", "recover_trainer", "restart_generator",
           "rollout_snapshot", "with_retries"]
