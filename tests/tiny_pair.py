"""Helpers over the tiny-pair fixtures (``paths``, ``rollouts`` in ``tests/conftest.py``) and
over the trainer's step batch (``graftpool.step_batch``)."""

from __future__ import annotations

from graftpool.contracts import GRAFT, OWN, PEER, RolloutGroup
from graftpool.step_batch import StepBatch
from workers.receiver.kinds.sgt import add_sgt_row
from workers.training.train_result import TrainResult


def grafts_for(receiver: str, donor: str, groups) -> list[RolloutGroup]:
    """The donor's mixed groups on the receiver's all-fail prompts (Eq. 4), to graft."""
    return [d for r, d in zip(groups[receiver], groups[donor], strict=True) if r.k == 0 and d.is_mixed]


def batch_of(own=(), grafts=(), sgt=(), peers=()) -> StepBatch:
    """A receiver's step batch from its parts: own groups, donor groups to graft, (prompt,
    response[, finished, prompt_id]) SGT items, (group, advantages) peer groups to add."""
    batch = StepBatch("receiver")
    for group in own:
        batch.add_group(OWN, group)
    for group in grafts:
        batch.add_group(GRAFT, group)
    for group, advantages in peers:
        batch.add_group(PEER, group, advantages)
    for item in sgt:
        add_sgt_row(batch, *item)
    return batch


def per_group(batch: StepBatch, result: TrainResult, kind: str, column: str) -> list[list]:
    """An outcome column of the rows of ``kind``, group by group."""
    return [[result.outcomes[column][r] for r in rows] for rows in batch.groups_of(kind)]


def own_updates(batch: StepBatch, result: TrainResult) -> dict[str, int]:
    """The update that trained each own group, by prompt id (-1: none, e.g. replaced by a graft)."""
    return {batch["prompt_id"][rows[0]]: max(result.outcomes["update"][r] for r in rows)
            for rows in batch.groups_of(OWN)}
