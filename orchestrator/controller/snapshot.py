"""Step snapshots: the last step's state kept in memory, so that a trainer's death costs at most
one step, with or without checkpoints.

After each step that writes no checkpoint (and at step 0), the controller keeps what a checkpoint
holds (``orchestrator.controller.checkpoint``), in memory instead of on disk:

* every trainer rank's files (weights as kept, optimiser state, version, RNG states), as the
  rank's ``snapshot_files`` returns them: the object is owned by the driver and held in Ray's object
  store on the rank's node, so the rank's death (a SIGKILL, the OOM killer) leaves it there;
  only the loss of the node takes it (then a checkpoint is what is left);
* in the driver: the run's state (:meth:`RunState.to_json`, copied), the replicas' and the
  driver's RNG states, the batch sampled ahead (``run.async: one_step``).

A newer snapshot replaces the older one (its object refs dropped, so Ray frees them); a checkpoint
drops it (the checkpoint is as new). A trainer's recovery goes back to whichever is newer
(``orchestrator.controller.faults.recover_trainer``). A snapshot whose files went with a lost node
(Ray's lost-object error when the new ranks fetch them) is dropped and the recovery goes back to the
latest checkpoint instead, or stops the run where there is none (:func:`restore_snapshot_else`).

Cost (``run.step_snapshot``): one copy of every rank's checkpoint files in the object store, for
the whole run (two while the next one is taken, until it replaces the older). With fp32 weights and AdamW that is 12 bytes a parameter and a rank (weights and
two moments; ``bf16-mixed`` keeps fp32 masters too): 1.5 GB for a 125 M model, 18 GB for 1.5 B, on
each rank's node; ZeRO shards divide it by the ranks. And the time of one save per step (the
ranks serialise into a temporary folder: what a checkpoint's save costs, without the fsync).
``auto`` (the default) takes snapshots only where there are no checkpoints
(``run.checkpoint_every: 0``), where a trainer's death would otherwise stop the run.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ray.exceptions import ObjectLostError

from orchestrator.cluster.actor_calls import get_all
from orchestrator.controller.checkpoint import driver_rng, restore_checkpoint, restore_state
from orchestrator.controller.run_state import Snapshot
from workers.training.trainer import TorchTrainer

if TYPE_CHECKING:
    import ray

    from orchestrator.cluster.model_actors import ModelActors
    from orchestrator.config import RunConfig
    from orchestrator.controller.run_state import RunContext


def takes_snapshots(run: RunConfig) -> bool:
    """``run.step_snapshot``: ``on``, ``off``, or ``auto`` (on where ``run.checkpoint_every`` is 0)."""
    return run.step_snapshot == "on" or (run.step_snapshot == "auto" and not run.checkpoint_every)


def keeps(run: RunConfig, step: int) -> str | None:
    """What is kept of step ``step`` (after its evaluation): ``checkpoint`` every
    ``run.checkpoint_every`` steps (and at step 0), else ``snapshot`` where :func:`takes_snapshots`,
    else None."""
    if run.checkpoint_every and step % run.checkpoint_every == 0:
        return "checkpoint"
    return "snapshot" if takes_snapshots(run) else None


def keep_state(ctrl: RunContext, step: int) -> None:
    """Keep step ``step`` as :func:`keeps` says: ``ctrl.checkpoint(step)`` or :func:`take_snapshot`."""
    kept = keeps(ctrl.config.run, step)
    if kept == "checkpoint":
        ctrl.checkpoint(step)
    elif kept == "snapshot":
        take_snapshot(ctrl, step)


def take_snapshot(ctrl: RunContext, step: int) -> Snapshot:
    """Keep step ``step``'s state as ``ctrl.state.snapshot`` (the older one dropped), once every
    rank's files are in the object store."""
    ctrl.stage = "snapshot"
    calls = {name: ctrl.actors[name].on_trainers(TorchTrainer.snapshot_files).refs for name in ctrl.names}
    get_all([done for pairs in calls.values() for _, done in pairs])  # a rank that died raises it here
    trainers = {name: [files for files, _ in pairs] for name, pairs in calls.items()}
    ctrl.state.snapshot = Snapshot(step, trainers, {"step": step, **copy.deepcopy(ctrl.state.to_json())},
                                   {name: list(states) for name, states in ctrl.state.gen_rng.items()},
                                   driver_rng(), copy.deepcopy(ctrl.state.pending))
    return ctrl.state.snapshot


def restore_trainers(actors: ModelActors, files: list[ray.ObjectRef]) -> int:
    """A model's ranks load a snapshot's files (``files``: each rank's ``snapshot_files`` object),
    each rank fetching them from the object store itself (``NodeFiles.load_snapshot``): the driver
    passes the refs on unopened. It held every rank's files at once before (a 3 B ZeRO-3 model's
    two ranks: 37 GB, on ``cluster.yaml``'s 32 GiB head). Returns the policy version."""
    return actors.on_trainers(TorchTrainer.load_snapshot, list(files)).get()


def restore_snapshot(ctrl: RunContext, snapshot: Snapshot) -> int:
    """Every model's ranks load their files of ``snapshot`` (:func:`restore_trainers`), then the
    rest as a checkpoint's (``restore_state``); returns its step."""
    def load(name: str) -> int:
        return restore_trainers(ctrl.actors[name], snapshot.trainers[name])

    return restore_state(ctrl, copy.deepcopy(snapshot.state), snapshot.gen_rng, snapshot.driver,
                         copy.deepcopy(snapshot.pending), load, f"the snapshot of step {snapshot.step}")


class SnapshotLost(RuntimeError):
    """A step snapshot's files could not be fetched: their only copy was in the object store of a
    node that is lost."""


def lost_objects(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray's error for an object that is gone (``ObjectLostError`` and its
    subclasses: ``ObjectReconstructionFailedError``, ``OwnerDiedError``, ...), raised by the
    driver's ``ray.get`` or, wrapped in a ``RayTaskError``, by an actor's."""
    return isinstance(exc, ObjectLostError) or isinstance(getattr(exc, "cause", None), ObjectLostError)


def restore_snapshot_else(ctrl: RunContext, snapshot: Snapshot, folder: Path | None, entry: dict,
                          stop: Callable[[str], Exception]) -> int:
    """:func:`restore_snapshot`, or, where its files went with a lost node, the snapshot dropped
    (``ctrl.state.snapshot``) and checkpoint ``folder`` restored instead, ``entry`` (the fault's
    record) saying so; where there is no checkpoint, ``stop(why)`` is raised: the run's one-line
    fatal error. A redo of the recovery (an actor died during it) goes to the checkpoint directly."""
    if ctrl.state.snapshot is snapshot:
        try:
            return restore_snapshot(ctrl, snapshot)
        except Exception as exc:
            if not lost_objects(exc):
                raise
            ctrl.state.snapshot = None
            lost = SnapshotLost(f"the snapshot of step {snapshot.step} was lost with its node "
                                f"({type(exc).__name__})")
            if folder is None:
                raise stop(f"{lost}, and there is no checkpoint to restore it from (a step snapshot is "
                           "kept in its ranks' nodes' memory; only checkpoints, run.checkpoint_every > 0, "
                           "survive a node's loss)") from exc
            warnings.warn(f"{lost}; going back to checkpoint {folder.name}", stacklevel=2)
            entry["action"] += f"; it was lost with its node: went back to checkpoint {folder.name}"
    assert folder is not None, "a dropped snapshot with no checkpoint stops the run"
    return restore_checkpoint(ctrl, folder)
