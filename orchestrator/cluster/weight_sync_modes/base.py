"""The weight-sync mode contract; its registry is the config's (``orchestrator.config.weight_syncs``).

A mode owns every branch that depends on it: the sync itself, what a replica started again gets,
which replicas a dead one takes with it, and what a restart undoes. ``ModelActors`` holds one
instance per model (its state: the last sync's weights, an open sync group) and asks it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from orchestrator.config.weight_syncs import WEIGHT_SYNCS

if TYPE_CHECKING:
    import ray

class Pending(Protocol):
    refs: list[ray.ObjectRef]

    def get(self) -> Any: ...


class SyncedActors(Protocol):
    """What a mode uses of ``orchestrator.cluster.model_actors.ModelActors`` (not imported: it imports this)."""

    name: str
    generators: list
    sync_bucket_mb: float
    sync_backend: str
    sync: WeightSync

    def on_trainers(self, method: Callable, *args: Any) -> Pending: ...
    def on_replicas(self, method: Callable, *args: Any) -> Pending: ...
    def on_replicas_at(self, indices: list[int] | None, method: Callable, *args: Any) -> Pending: ...
    def switch_weight_sync(self, name: str) -> None: ...


class WeightSync(ABC):
    """One model's weight sync, trainer -> generation replicas."""

    name: ClassVar[str]  # set by register_weight_sync
    keeps_weights: ClassVar[bool] = False
    """Whether a replica started again gets the weights its peers sampled with (the last sync's),
    not the trainer's current ones: what ``run.async: one_step`` needs."""

    @abstractmethod
    def sync(self, actors: SyncedActors, only: list[int] | None = None) -> list[ray.ObjectRef]:
        """The trainer's weights to the replicas (``only``: those indices; every one if None).
        Returns the calls in flight (trainer ranks' and replicas')."""

    @abstractmethod
    def reload(self, actors: SyncedActors, indices: list[int]) -> list[ray.ObjectRef]:
        """Replicas ``indices``, just started again, get the weights the others hold."""

    def lost_with(self, actors: SyncedActors, index: int) -> list[int]:
        """The replicas to start again when replica ``index`` dies: itself."""
        return [index]

    def restarted(self) -> None:
        """A replica or trainer rank of the model was started again (nothing to undo here)."""
        return None


register_weight_sync = WEIGHT_SYNCS.register_named
