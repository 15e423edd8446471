"""Per-token arrays that go from one actor to another without the driver opening them (issue #54).

A trainer's scoring pass (``score``: pi_old of own responses; ``score_peers``: a receiver's
log-probs of peer responses) puts its per-token log-probs into the Ray object store once, from
the actor (:func:`put_rows`), and answers one :class:`TokenRef` per row: the object's reference
and the row's index in it. The controller keeps only the per-row means it routes with; the refs
ride in its records, unopened, to the receivers' ``train`` (the same model's own rows, and the
rows of kinds that read the donor's tokens, ``RowKind.donor_tokens``: every graft row, for the ln s
split and ``exchange.gate_kind: answer_masked``, whose objects the donor's trainer owns), where
:func:`resolve` fetches each object once, at ``train``'s start, and puts the arrays back in the
cells. The trainers' log-probs are byte for byte what they computed; only the driver no longer
holds (or ships twice) a float per token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from graftpool.step_record import StepRecord


@dataclass(frozen=True)
class TokenRef:
    """Row ``index`` of a list of per-token arrays in the object store (``ref``, a ``ray.ObjectRef``)."""

    ref: object
    index: int


def put_rows(arrays: list[np.ndarray]) -> list[TokenRef]:
    """``arrays`` put in the object store as one object (by the calling actor, which owns it):
    one :class:`TokenRef` per array, in order."""
    import ray

    ref = ray.put(arrays)
    return [TokenRef(ref, i) for i in range(len(arrays))]


def resolve(record: StepRecord, column: str, rows: Sequence[int] | None = None) -> StepRecord:
    """``record`` with each :class:`TokenRef` cell of ``column`` at ``rows`` (None: every row)
    replaced by the array it points at, each object fetched once (``ray.get``); other cells are
    kept as they are (arrays, None, and refs at other rows)."""
    if column not in record:
        return record
    cells = list(record[column])
    wanted = [r for r in (range(len(cells)) if rows is None else rows) if isinstance(cells[r], TokenRef)]
    if not wanted:
        return record
    import ray

    refs = list(dict.fromkeys(cells[r].ref for r in wanted))
    fetched = dict(zip(refs, ray.get(refs), strict=True))
    for r in wanted:
        cells[r] = fetched[cells[r].ref][cells[r].index]
    return record.with_columns(**{column: cells})
