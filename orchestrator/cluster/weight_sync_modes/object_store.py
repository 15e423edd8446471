"""``weight_sync: object_store``: rank 0's state dict put into Ray's object store, loaded by each replica."""

from __future__ import annotations

import ray

from orchestrator.cluster.weight_sync_modes.base import (
    SyncedActors,
    WeightSync,
    register_weight_sync,
)
from workers.rollout.generation import GenerationWorker
from workers.training.trainer import TorchTrainer


@register_weight_sync("object_store")
class ObjectStoreSync(WeightSync):
    """Every trainer rank's ``weights_for_sync`` (ZeRO-3 gathers collectively; rank 0's is the
    state dict) as an object ref that never passes through the driver, loaded by each replica. The
    ref is kept (:attr:`synced`), so a replica started again gets the weights its peers hold."""

    keeps_weights = True

    def __init__(self) -> None:
        self.synced: tuple[ray.ObjectRef, ray.ObjectRef] | None = None  # the weights, their version

    def sync(self, actors: SyncedActors, only: list[int] | None = None) -> list[ray.ObjectRef]:
        version = actors.on_trainers(TorchTrainer.get_version).refs[0]
        gathered = actors.on_trainers(TorchTrainer.weights_for_sync).refs
        self.synced = (gathered[0], version)
        return [*gathered[1:], *actors.on_replicas_at(only, GenerationWorker.load_weights, *self.synced).refs]

    def reload(self, actors: SyncedActors, indices: list[int]) -> list[ray.ObjectRef]:
        """The last sync's weights (none before the first sync: the model's own, which they loaded)."""
        if self.synced is None:
            return []
        return actors.on_replicas_at(indices, GenerationWorker.load_weights, *self.synced).refs
