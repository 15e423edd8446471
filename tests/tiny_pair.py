"""Helpers over the tiny-pair fixtures (``paths``, ``rollouts`` in ``tests/conftest.py``) and
over the trainer's step batch (``graftpool.step_batch``)."""

from __future__ import annotations

from graftpool.contracts import OWN, RolloutGroup
from graftpool.step_batch import StepBatch
from workers.training.train_result import TrainResult


def grafts_for(receiver: str, donor: str, groups) -> list[RolloutGroup]:
    """The donor's mixed groups on the receiver's all-fail prompts (Eq. 4), to graft."""
    return [d for r, d in zip(groups[receiver], groups[donor], strict=True) if r.k == 0 and d.is_mixed]


def batch_of(own=(), grafts=(), sgt=(), peers=()) -> StepBatch:
    """A receiver's step batch from its parts (``StepBatch.of``)."""
    return StepBatch.of("receiver", own, grafts, peers, sgt)


def per_group(batch: StepBatch, result: TrainResult, kind: str, column: str) -> list[list]:
    """An outcome column of the rows of ``kind``, group by group."""
    return [[result.outcomes[column][r] for r in rows] for rows in batch.groups_of(kind)]


def own_updates(batch: StepBatch, result: TrainResult) -> dict[str, int]:
    """The update that trained each own group, by prompt id (-1: none, e.g. replaced by a graft)."""
    return {batch["prompt_id"][rows[0]]: max(result.outcomes["update"][r] for r in rows)
            for rows in batch.groups_of(OWN)}
