"""``weight_sync: collective``: trainer rank 0 broadcasts in buckets to every replica over their
sync group (``workers.rollout.weight_sync``), opened on first use and again after any restart."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from orchestrator.cluster.actor_calls import get_all
from orchestrator.cluster.weight_sync_modes.base import (
    SyncedActors,
    WeightSync,
    register_weight_sync,
)
from workers.rollout.generation import GenerationWorker
from workers.training.trainer import TorchTrainer

if TYPE_CHECKING:
    import ray



def shared_gpus(devices: list[str]) -> bool:
    """Whether two of a sync group's members (their CUDA device UUIDs) sit on the same GPU."""
    on_gpu = [d for d in devices if d]
    return len(set(on_gpu)) < len(on_gpu)


@register_weight_sync("collective")
class CollectiveSync(WeightSync):
    """Rank 0 (the source, hosting the group at its node) and the replicas (ranks 1..R) in one
    gloo / NCCL group; every sync is one bucketed broadcast to all of them."""

    def __init__(self) -> None:
        self.open = False  # the trainer and every current replica joined the group
        self.begun = False  # the replicas began a sync group (a death then takes them all)

    def sync(self, actors: SyncedActors, only: list[int] | None = None) -> list[ray.ObjectRef]:
        """Every replica takes part in the broadcast (``only`` is covered)."""
        if not self.open and not self.open_group(actors):
            return actors.sync.sync(actors, only)  # one shared GPU: the object store took over
        version = actors.on_trainers(TorchTrainer.get_version).refs[0]
        return [*actors.on_trainers(TorchTrainer.broadcast_weights).refs,
                *actors.on_replicas(GenerationWorker.receive_weights, version).refs]

    def reload(self, actors: SyncedActors, indices: list[int]) -> list[ray.ObjectRef]:
        """A new sync of the trainer's weights (the group is opened again with the new replicas)."""
        return self.sync(actors, indices)

    def lost_with(self, actors: SyncedActors, index: int) -> list[int]:
        """Once the replicas began a sync group, every replica: the others may be stuck in a
        broadcast, or in the group's formation, with the dead one (a broadcast's root fails at
        once, its other receivers wait out the broadcast's time limit), as a trainer rank takes
        its peers."""
        return list(range(len(actors.generators))) if self.begun else [index]

    def restarted(self) -> None:
        """A new member joins a new group with the others."""
        self.open = False

    def open_group(self, actors: SyncedActors) -> bool:
        """Open the sync group. Every replica answers first (a new one has finished its
        ``__init__``, a dead one is noticed), so that none of the others waits in the group's
        formation for a member that cannot come (``workers.rollout.weight_sync.RENDEZVOUS_S``).
        Over NCCL with two members on one GPU the model turns to the object store (False)."""
        actors.on_replicas(GenerationWorker.version).get()
        self.begun = True
        if actors.sync_backend == "nccl":
            devices = [*actors.on_trainers(TorchTrainer.device_uuid).get()[:1],
                       *actors.on_replicas(GenerationWorker.device_uuid).get()]
            if shared_gpus(devices):
                warnings.warn(f"model {actors.name}: models[].generation.weight_sync collective over NCCL needs "
                              f"trainer rank 0 and each generation replica on a GPU of its own, but they share one "
                              f"(NCCL refuses two ranks on one device: 'Duplicate GPU detected'); its weights go "
                              f"through the object store instead", stacklevel=4)
                actors.switch_weight_sync("object_store")
                return False
        plan = actors.on_trainers(TorchTrainer.sync_plan, actors.sync_bucket_mb).get()
        host, port = actors.on_trainers(TorchTrainer.rendezvous).get()
        world = 1 + len(actors.generators)
        get_all([*actors.on_trainers(TorchTrainer.open_sync_group, host, port, world, plan, actors.sync_backend).refs,
                 *actors.on_replicas(GenerationWorker.open_sync_group, host, port,
                                     list(range(1, world)), world, plan, actors.sync_backend).refs])
        self.open = True
        return True
