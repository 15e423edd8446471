"""What a trainer's ``train`` call returns: the step's metrics, what happened to every peer
response it was given, and the optimizer updates it took (``workers.training.trainer``)."""

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
    metrics: dict[str, float]
    # per graft (same order as given): compat s and weight w of each donor response
    graft_compat: list[list[float]]
    graft_weight: list[list[float]]
    graft_tokens: list[list[int]]  # length of each donor response in the receiver's tokens
    version: int
    timings: dict[str, float]
    graft_advantage: list[list[float]] = field(default_factory=list)  # what each was trained with
    # per peer group (HACPO, same order as given): s and effective weight of each response at
    # its update (NaN: it re-tokenised to nothing), and its length in the receiver's tokens
    peer_ratio: list[list[float]] = field(default_factory=list)
    peer_weight: list[list[float]] = field(default_factory=list)
    peer_tokens: list[list[int]] = field(default_factory=list)
    # the optimizer updates actually taken, in order
    minibatches: list[Update] = field(default_factory=list)
    # the index (in ``minibatches``) of the update that trained each input, -1: none: own
    # groups by prompt id, each grafted / peer response, each SGT item
    own_update: dict[str, int] = field(default_factory=dict)
    graft_update: list[list[int]] = field(default_factory=list)
    peer_update: list[list[int]] = field(default_factory=list)
    sgt_update: list[int] = field(default_factory=list)
