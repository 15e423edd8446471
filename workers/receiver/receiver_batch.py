"""A receiver's training rows for one step, built from its rows of the step's train record
(``graftpool.step_record``) by the row kinds (``workers.receiver.kinds``: own, graft, peer,
sgt): the :class:`workers.training.batching.TrainRow` rows, their groups, the gate's tally and
the per-row outcome columns the trainer returns (``graftpool.step_record.OUTCOMES``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from graftpool.step_record import StepRecord
from workers.training.batching import TrainRow, round_trips


@dataclass
class GateTally:
    """Offered / admitted peer responses of one step, by the sign of their advantage."""

    offered: int = 0
    admitted: int = 0
    by_sign: np.ndarray = field(default_factory=lambda: np.zeros((2, 2)))  # [pos, neg] x [offered, admitted]
    s_values: list[float] = field(default_factory=list)
    w_values: list[float] = field(default_factory=list)
    retokenized: int = 0  # peer strings re-tokenised by the receiver
    lossy: int = 0  # ... whose tokens do not decode back to the string (workers.training.batching.round_trips)

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
        }


@dataclass
class ReceiverBatch:
    """The training rows of a receiver's batch (its rows of the train record), their groups' kinds
    (``group_is_peer[row.group]``) and the outcome columns, one value per batch row."""

    step: StepRecord
    rows: list[TrainRow] = field(default_factory=list)
    group_is_peer: list[bool] = field(default_factory=list)
    tally: GateTally = field(default_factory=GateTally)
    n_tokens: list[int] = field(default_factory=list)
    compat: list[float] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)
    trained_advantage: list[float] = field(default_factory=list)
    # the training row each batch row became (None: it never entered the training batch), so
    # that the optimizer update that trained it (``TrainRow.update``) can be reported back
    refs: list[TrainRow | None] = field(default_factory=list)
    slots: dict[int, int] = field(default_factory=dict)  # peer batch row -> its slot in the step's peer output

    def __post_init__(self) -> None:
        n = len(self.step)
        self.n_tokens = [0] * n
        self.compat = [float("nan")] * n
        self.weight = [0.0] * n
        self.trained_advantage = list(self.step["advantage"])
        self.refs = [None] * n

    def new_group(self, is_peer: bool) -> int:
        self.group_is_peer.append(is_peer)
        return len(self.group_is_peer) - 1

    def outcomes(self) -> dict[str, list]:
        """The outcome columns (``graftpool.step_record.OUTCOMES``), one value per batch row."""
        return {"n_tokens": self.n_tokens, "compat": self.compat, "weight": self.weight,
                "trained_advantage": self.trained_advantage,
                "update": [-1 if row is None else row.update for row in self.refs]}


def float_column(step: StepRecord, name: str, rows: list[int]) -> np.ndarray:
    """One column over ``rows`` as floats (None: NaN)."""
    return np.array([np.nan if step[name][r] is None else step[name][r] for r in rows], dtype=float)
