"""Row kinds: which rows of the step's record a route of each kind puts into a receiver's batch,
and how the trainer trains those rows (:class:`~workers.receiver.kinds.base.RowKind`). A new kind
is a module here, its name in ``graftpool.contracts`` and its import below."""

from workers.receiver.kinds import graft, own, peer, sgt  # noqa: F401  (registration)
from workers.receiver.kinds.base import (
    ROW_KINDS,
    RowKind,
    TrainBatchBuilder,
    TrainerView,
    groups_of,
    kinds_in_order,
)

__all__ = ["ROW_KINDS", "RowKind", "TrainBatchBuilder", "TrainerView", "groups_of", "kinds_in_order"]
