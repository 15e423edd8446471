"""The one line a run ends with when an actor's death cannot be survived (``faults.fatal``), and
what it tells the user to do next: resume from the latest checkpoint, or, where there is none yet
(a death at start-up, ``run.checkpoint_every: 0``), that a resume starts the run again; or, for an
evaluation-only start (``graftpool eval``), to run that again (it takes no ``--resume``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.controller.checkpoint import latest_checkpoint

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext

RESUME_HINT = "fix the cause, then run the same command with --resume to go on from the latest checkpoint"
NO_CHECKPOINT_HINT = "the run has no checkpoint to go on from yet: --resume would start it again at step 1"
EVAL_HINT = "fix the cause, then run the same graftpool eval command again"


class ActorLost(RuntimeError):
    """An actor died and the run could not go on (retries spent, or no checkpoint)."""


def stop(message: str, hint: str = RESUME_HINT) -> ActorLost:
    """The error that ends the run: ``message`` and what to do next (``hint``), on one line."""
    return ActorLost(f"{message}; {hint}")


def next_step_hint(ctrl: RunContext) -> str:
    """What the stop line tells the user: run an evaluation again, resume from the latest
    checkpoint, or (none yet) that a resume starts the run again, its step files dropped where
    ``run.checkpoint_every`` is 0."""
    if not ctrl.trains:
        return EVAL_HINT
    if latest_checkpoint(ctrl.run_dir) is not None:
        return RESUME_HINT
    dropped = ", its step files dropped (run.checkpoint_every keeps checkpoints)" if not ctrl.config.run.checkpoint_every else ""
    return NO_CHECKPOINT_HINT + dropped
