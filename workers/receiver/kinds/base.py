"""The row-kind interface: what a route of one kind puts into a receiver's
:class:`~graftpool.step_batch.StepBatch` (controller side) and how the receiver's trainer turns
those rows into training rows (trainer side), in one object per kind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from graftpool.contracts import RolloutGroup, Route
from graftpool.registry import Registry
from graftpool.step_batch import StepBatch
from workers.receiver.peer_transfer import PeerTransfer
from workers.receiver.receiver_batch import ReceiverBatch
from workers.training.batching import TrainRow

PromptIds = Callable[[str], list[int]]
ScoreRows = Callable[[list[TrainRow]], list[torch.Tensor]]


@dataclass(frozen=True)
class TrainerView:
    """What a kind's :meth:`RowKind.add` may use of the receiver's trainer."""

    tokenizer: object
    prompt_ids: PromptIds  # the receiver's own rendering of a prompt, as ids
    score_rows: ScoreRows  # per-row token log-probs under the pre-update weights
    transfer: PeerTransfer  # the gate and the peer advantages (Eqs. 6-8)
    old_logps: dict[tuple[str, int], torch.Tensor] | None  # own rows' pi_old (recompute), None: on-policy


class RowKind:
    """One route kind. ``order``: where its rows come in the training batch and the store (own
    first: later kinds may join the own groups, as SGT does). Subclass it in a module of
    ``workers/receiver/kinds/`` and :func:`register_kind` an instance."""

    name: str = ""
    order: int = 0
    replaces_own: bool = False  # the receiver's own group on the prompt is not trained (a graft)
    has_compat: bool = False  # its rows carry a compatibility (the gate's s, or a cross ratio)

    def plan(self, batch: StepBatch, route: Route, donor_group: RolloutGroup, donor: str) -> None:
        """Controller side: the rows ``route`` gives the receiver, appended to ``batch``."""
        raise NotImplementedError

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        """Trainer side: this kind's batch rows as training rows (``rows.rows``), with their
        outcome columns filled in."""
        raise NotImplementedError

    def after_update(self, rows: ReceiverBatch, peer_out: torch.Tensor) -> None:
        """Trainer side, after the updates: outcomes known only then (``peer_out``: each peer
        slot's s and weight at its update)."""

    def received(self, batch: StepBatch, failed: set[str]) -> int:
        """How many of this kind's groups count as received for ``exchange/received`` (``failed``:
        the receiver's all-fail prompt ids)."""
        return 0

    def step_metrics(self, batch: StepBatch) -> dict[str, float]:
        """This kind's own per-step metrics."""
        return {}


ROW_KINDS: Registry[RowKind] = Registry("row kind", "Route.kind")


def register_kind(kind: RowKind) -> RowKind:
    return ROW_KINDS.register(kind.name)(kind)


def kinds_in_order() -> list[RowKind]:
    """Every registered kind, in batch order."""
    return sorted((ROW_KINDS.get(name) for name in ROW_KINDS.names()), key=lambda kind: kind.order)
