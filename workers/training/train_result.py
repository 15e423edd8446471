"""What a trainer's ``train`` call returns: the step's metrics, the optimizer updates it took,
and what happened to every row it was given (``workers.training.trainer``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple


class Update(NamedTuple):
    """One optimizer update the trainer took: which rows (own only, peer only, or mixed), how
    many, and its loss (the minibatch's objective, summed over micro-batches and ranks), its
    response tokens, its gradient norm before clipping, and the norms of the parts of that
    gradient that came from own rows and from peer rows (grafted, added or SGT; NaN where the
    backend does not expose its gradient)."""

    kind: str  # own | peer | mixed
    rows: int
    loss: float
    tokens: int = 0
    grad_norm: float = float("nan")
    own_grad_norm: float = float("nan")
    peer_grad_norm: float = float("nan")


@dataclass
class TrainResult:
    """One ``train`` call's outcome: the step's metrics, the policy version after it, the phase
    timings, the optimizer updates taken (in order) and the batch's outcome columns, one value
    per row of the train record's rows it was given (``graftpool.step_record.OUTCOMES``:
    n_tokens, compat, weight, trained_advantage, update)."""

    metrics: dict[str, float]
    version: int
    timings: dict[str, float]
    minibatches: list[Update] = field(default_factory=list)
    outcomes: dict[str, list] = field(default_factory=dict)
