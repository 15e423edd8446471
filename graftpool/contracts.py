"""Data contracts shared by every layer (orchestrator, workers, policies, dashboards).

Nothing here imports Ray or torch: these are plain typed records that travel between
actors (pickled by Ray) and into the trajectory store.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graftpool.registry import Registry

ROW_KINDS: Registry[Any] = Registry("row kind", "Route.kind")
"""Route kind name -> its row kind (a ``workers.receiver.kinds.RowKind``: the rows a route of the
kind puts into the train record, how the receiver's trainer trains them). The built-in kinds
register from ``workers/receiver/kinds/``; a transfer that brings kinds of its own registers them
with itself (``policies.transfer.Transfer.row_kinds``). No central list of kind names: a new
kind is a name in this registry."""

# Names of the built-in kinds of route (``workers/receiver/kinds/``).
GRAFT = "graft"  # the receiver's all-fail group is replaced by the donor's whole group
SGT = "sgt"  # one correct donor response is added as a supervised (NLL) term
PEER = "peer"  # the donor's whole group is ADDED to the receiver's own (HACPO), with ``advantages``
OWN = "own"  # donor == receiver: its own group on the prompt is trained with ``advantages`` (HACPO)

SUCCESS_THRESHOLD = 0.5
"""A response is a success (it counts in k, Eq. 4) when its reward is above this: with the
built-in verifiers' 0/1 rewards, exactly the correct ones; with a reward plugin's fractional
rewards (``workers.verify.plugin_verifier``), those it scores closer to right than to wrong.
Advantages (Eq. 1) and every reward mean use the real-valued rewards."""


def pass_at_1(rewards: Sequence[Sequence[float]]) -> float:
    """pass@1 of an eval set from its rewards (``rewards[i][j]``: prompt i, sample j): the
    chance that one sample is a success, estimated per prompt and averaged over prompts,

        pass@1 = (1 / P) * sum_i (1 / n_i) * sum_j 1[r_ij > SUCCESS_THRESHOLD]

    With 0/1 rewards this is the mean reward; a reward plugin's fractional rewards (a right
    answer penalised to 0.6, a wrong one at 0.1) count as right or wrong, not as their value."""
    per_prompt = [sum(float(r) > SUCCESS_THRESHOLD for r in row) / len(row) for row in rewards if len(row)]
    return sum(per_prompt) / len(per_prompt) if per_prompt else float("nan")


@dataclass(frozen=True)
class Route:
    """One exchange decision: donor ``donor``'s group on prompt ``prompt`` goes to ``receiver``.

    Indices refer to the rows of the :class:`ExchangeInput` the policy was given. ``kind``
    names a row kind (:data:`ROW_KINDS`); the built-in ones are :data:`GRAFT` (whole group),
    :data:`SGT` (only ``samples``, one correct response), :data:`PEER` (whole group, added to
    the receiver's own) and :data:`OWN` (the receiver's own group, re-weighted). ``advantages`` ([n], optional) are what the receiver trains the
    group with; None: the donor's own GRPO advantages (Eq. 1).
    """

    donor: int
    receiver: int
    prompt: int
    kind: str = GRAFT
    samples: tuple[int, ...] | None = None  # None: the whole group
    advantages: tuple[float, ...] | None = None

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.donor, self.receiver, self.prompt)


@dataclass
class ExchangeInput:
    """What an exchange policy sees for one step (docs/algorithm.md section 4).

    ``rewards[m, q, i]`` is the reward of model m's i-th response on prompt q. Rows of
    ``rewards`` past the live models (``live[m] is False``) are donors that are not being
    trained, e.g. groups read from an earlier run's trajectory store; a NaN row there means
    the store holds no group for that prompt.
    """

    models: list[str]
    prompt_ids: list[str]
    rewards: np.ndarray  # [M, P, n]
    live: np.ndarray | None = None  # [M] bool; None: every row is live
    compatibility: np.ndarray | None = None  # [M donor, M receiver, P] mean s, NaN if unscored

    def __post_init__(self) -> None:
        self.rewards = np.asarray(self.rewards, dtype=float)
        if self.rewards.ndim != 3:
            raise ValueError(f"rewards must be [models, prompts, n], got shape {self.rewards.shape}")
        m, p, _ = self.rewards.shape
        if len(self.models) != m or len(self.prompt_ids) != p:
            raise ValueError(
                f"rewards shape {self.rewards.shape} does not match {len(self.models)} models "
                f"and {len(self.prompt_ids)} prompts"
            )
        self.live = np.ones(m, dtype=bool) if self.live is None else np.asarray(self.live, bool)

    @property
    def n(self) -> int:
        return int(self.rewards.shape[2])

    @property
    def k(self) -> np.ndarray:
        """Successes per model and prompt (rewards above :data:`SUCCESS_THRESHOLD`), [M, P];
        -1 where a (stored) donor has no group."""
        present = ~np.isnan(self.rewards).any(axis=2)
        return np.where(present, (self.rewards > SUCCESS_THRESHOLD).sum(axis=2), -1).astype(int)


@dataclass(frozen=True)
class ObjectiveSpec:
    """Which policy-gradient objective the receivers minimise this step, and its parameters:
    a name in ``workers.receiver.objective.OBJECTIVES`` (``token``: the GRAFT/GRPO token-level ratio;
    ``sequence``: HACPO's sequence-level one). An exchange policy chooses it; None: ``token``
    with the ``algorithm`` section's clip range."""

    name: str = "token"
    params: dict = field(default_factory=dict)
