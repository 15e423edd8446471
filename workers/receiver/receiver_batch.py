"""A receiver's rows of the step's train record (``graftpool.step_record``) and the columns its
trainer adds to them: the row kinds (``workers.receiver.kinds``: own, graft, peer, sgt) write
each trained row's training columns (:data:`TRAINING`: its tokens, training group, loss term,
pi_old, ...) and its outcome columns (``graftpool.step_record.OUTCOMES``), and keep the gate's
tally. There is no row object: the update reads the columns of the trained rows
(:meth:`ReceiverBatch.training`) and turns them into micro-batch tensors once
(``workers.training.batching.pad_rows``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graftpool.step_record import StepRecord
from workers.receiver.retokenize import round_trips

POLICY = "policy"
"""The loss term of the policy-gradient rows (the step's objective, ``workers.receiver.objective``);
any other term is the name of the row kind whose ``loss`` trains those rows."""

TRAINING = ("prompt_ids", "response_ids", "train_group", "peer", "term", "old_logp", "source_mean", "slot")
"""The training columns a kind writes for each row it trains: the receiver's prompt ids and response
ids, the row's training group (-1: not trained; groups in the order the kinds open them), whether
it is a peer row, its loss term (:data:`POLICY` or a kind's name), pi_old's per-token log-probs
(None: on-policy), the source side's mean log-likelihood (a HACPO peer row; NaN: none) and its
slot in the step's peer output (-1: none). With the outcome columns ``trained_advantage`` (the
advantage it is trained with) and ``weight`` (its loss weight while it trains)."""


@dataclass
class GateTally:
    """Offered / admitted peer responses of one step, by the sign of their advantage."""

    offered: int = 0
    admitted: int = 0
    by_sign: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))  # [pos, neg] x [offered, admitted]
    s_values: list[float] = field(default_factory=list)
    w_values: list[float] = field(default_factory=list)
    retokenized: int = 0  # peer strings re-tokenised by the receiver
    lossy: int = 0  # ... whose tokens do not decode back to the string (workers.receiver.retokenize.round_trips)
    over_budget: int = 0  # ... whose row is past the token budget: not scored, not trained (retokenize.over_budget)

    def check_round_trip(self, tokenizer, text: str, ids: list[int], finished: bool) -> None:
        self.retokenized += 1
        self.lossy += not round_trips(tokenizer, text, ids, finished)

    def add(self, advantage: float, offered: bool, weight: float, s: float) -> None:
        if not offered:
            return
        self.offered += 1
        if advantage != 0:  # the sign of the donor's own advantage: correct or not
            self.by_sign[int(advantage < 0)] += (1, weight > 0)
        if np.isfinite(s):
            self.s_values.append(float(s))
        if weight > 0:
            self.admitted += 1
            self.w_values.append(float(weight))

    def metrics(self) -> dict[str, float]:
        by_sign = self.by_sign
        return {
            "gate/offered": float(self.offered),
            "gate/admitted": float(self.admitted),
            "gate/admission_rate": self.admitted / self.offered if self.offered else float("nan"),
            # the gate's bias: a receiver that fails a prompt finds the peer's correct answers
            # least likely, so it may admit mostly the peer's negative-advantage responses
            "gate/admission_rate_pos": by_sign[0, 1] / by_sign[0, 0] if by_sign[0, 0] else float("nan"),
            "gate/admission_rate_neg": by_sign[1, 1] / by_sign[1, 0] if by_sign[1, 0] else float("nan"),
            "gate/mean_s": float(np.mean(self.s_values)) if self.s_values else float("nan"),
            "gate/mean_w": float(np.mean(self.w_values)) if self.w_values else float("nan"),
            "gate/lossy_retokenized": self.lossy / self.retokenized if self.retokenized else float("nan"),
            "gate/over_budget": float(self.over_budget),
        }


@dataclass
class ReceiverBatch:
    """A receiver's rows of the train record (``step``), the kinds of its training groups
    (``group_is_peer[g]``), the gate's tally and, one value per row, the training columns
    (:data:`TRAINING`) and the outcome columns."""

    step: StepRecord
    group_is_peer: list[bool] = field(default_factory=list)
    tally: GateTally = field(default_factory=GateTally)
    columns: dict[str, list] = field(default_factory=dict)
    outcome_defaults: dict[str, object] = field(default_factory=dict)  # the kinds' own outcome columns
    slots: int = 0  # slots of the step's peer output handed out (:meth:`new_slot`), across every kind

    def __post_init__(self) -> None:
        n = len(self.step)
        defaults = {"prompt_ids": None, "response_ids": None, "train_group": -1, "peer": False, "term": POLICY,
                    "old_logp": None, "source_mean": float("nan"), "slot": -1,
                    "n_tokens": 0, "compat": float("nan"), "weight": 0.0, "update": -1}
        self.columns = {name: [value] * n for name, value in defaults.items()}
        self.columns["trained_advantage"] = list(self.step["advantage"])
        self.columns |= {name: [value] * n for name, value in self.outcome_defaults.items()}

    def __getitem__(self, name: str) -> list:
        """A training or outcome column, one value per row."""
        return self.columns[name]

    def new_group(self, is_peer: bool) -> int:
        self.group_is_peer.append(is_peer)
        return len(self.group_is_peer) - 1

    def new_slot(self) -> int:
        """The next free row of the step's peer output (``peer_out``: s and weight at the update),
        numbered across every kind that hands them out, so that no two rows share one."""
        self.slots += 1
        return self.slots - 1

    def train(self, r: int, prompt_ids: list[int], response_ids: list[int], group: int, *, peer: bool = False,
              term: str = POLICY, old_logp=None, source_mean: float = float("nan"), slot: int = -1) -> None:
        """Row ``r`` is trained, in training group ``group``, with these training columns."""
        values = {"prompt_ids": list(prompt_ids), "response_ids": list(response_ids), "train_group": group,
                  "peer": peer, "term": term, "old_logp": old_logp, "source_mean": source_mean, "slot": slot}
        for name, value in values.items():
            self.columns[name][r] = value

    def trained_rows(self) -> list[int]:
        """The trained rows in training order: group by group, each group's rows in batch order."""
        groups = self.columns["train_group"]
        return sorted((r for r in range(len(self.step)) if groups[r] >= 0), key=lambda r: (groups[r], r))

    def training(self) -> StepRecord:
        """The trained rows' columns (the record's, :data:`TRAINING`, ``trained_advantage``,
        ``weight`` and ``row``, the row's index in ``step``), in training order."""
        order = self.trained_rows()
        names = (*TRAINING, "trained_advantage", "weight")
        columns = {name: [self.columns[name][r] for r in order] for name in names}
        return self.step.select(order).with_columns(row=order, **columns)

    def outcomes(self, names: tuple[str, ...]) -> dict[str, list]:
        """The outcome columns ``names``, one value per row."""
        return {name: self.columns[name] for name in names}


def float_column(step: StepRecord, name: str, rows: list[int]) -> np.ndarray:
    """One column over ``rows`` as floats (None: NaN)."""
    return np.array([np.nan if step[name][r] is None else step[name][r] for r in rows], dtype=float)
