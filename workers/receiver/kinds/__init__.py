"""Row kinds: which rows of the step's record a route of each kind puts into a receiver's batch,
and how the trainer trains those rows (:class:`~workers.receiver.kinds.base.RowKind`), registered
by name in ``graftpool.contracts.ROW_KINDS``. Every module of this package is imported here (a
built-in kind is one module, nothing else to edit); a transfer that brings a kind of its own
registers it with itself (``policies.transfer.Transfer.row_kinds``)."""

import importlib
import pkgutil

from graftpool.contracts import ROW_KINDS
from workers.receiver.kinds.base import (
    RowKind,
    TrainBatchBuilder,
    TrainerView,
    groups_of,
    kinds_in_order,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")  # registration

__all__ = ["ROW_KINDS", "RowKind", "TrainBatchBuilder", "TrainerView", "groups_of", "kinds_in_order"]
