"""A receiver's training rows for one step, built from its :class:`~graftpool.step_batch.StepBatch`:
own groups, grafted groups through the gate, added peer groups (HACPO) and SGT items, as
:class:`workers.training.batching.TrainRow` rows, and the per-row outcome columns the trainer
returns (``graftpool.step_batch.OUTCOME_COLUMNS``).

- ``own`` rows: the receiver's groups, trained with their ``advantage`` unless a graft
  replaces the group (docs/algorithm.md section 2, step 6);
- ``graft`` rows: a donor group that replaces an all-fail own group; each response is
  re-tokenised, scored under the receiver's pre-update weights and admitted by
  ``workers.receiver.peer_transfer`` (the gate, Eqs. 7-8);
- ``peer`` rows: a donor group ADDED to the receiver's own (HACPO), with the advantages the
  policy gave; the sequence objective weighs it (``workers.receiver.objective``);
- ``sgt`` rows: one correct peer response as an NLL term (the SGT baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from graftpool.contracts import GRAFT, OWN, PEER, SGT
from graftpool.step_batch import StepBatch
from workers.receiver.peer_transfer import PeerTransfer
from workers.training.batching import TrainRow, retokenize, round_trips


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
    """The training rows of a :class:`StepBatch`, their groups' kinds (``group_is_peer[row.group]``)
    and the outcome columns, one value per batch row."""

    step: StepBatch
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
        """The outcome columns (``graftpool.step_batch.OUTCOME_COLUMNS``), one value per batch row."""
        return {"n_tokens": self.n_tokens, "compat": self.compat, "weight": self.weight,
                "trained_advantage": self.trained_advantage,
                "update": [-1 if row is None else row.update for row in self.refs]}


PromptIds = Callable[[str], list[int]]
ScoreRows = Callable[[list[TrainRow]], list[torch.Tensor]]


def add_own(batch: ReceiverBatch, prompt_ids: PromptIds, old_logps: dict[tuple[str, int], torch.Tensor] | None) -> None:
    """The receiver's own groups not replaced by a graft; ``old_logps`` None: exactly on-policy
    (pi_old = sg(pi_theta) in the loss, ``workers.training.sampling_logprobs``)."""
    step = batch.step
    replaced = {step["prompt_id"][r] for r in step.rows(GRAFT)}
    for rows in step.groups_of(OWN):
        first = rows[0]
        for r in rows:
            batch.n_tokens[r], batch.weight[r] = len(step["token_ids"][r]), 1.0
        if step["prompt_id"][first] in replaced:
            continue
        ids = prompt_ids(step["prompt"][first])
        gid = batch.new_group(False)
        for r in rows:
            prompt_id, sample = step["prompt_id"][r], step["sample"][r]
            row = TrainRow(ids, list(step["token_ids"][r]), float(step["advantage"][r]), 1.0, False, False, gid,
                           old_logps[(prompt_id, sample)] if old_logps is not None else None, prompt_id=prompt_id)
            batch.rows.append(row)
            batch.refs[r] = row


def add_grafts(batch: ReceiverBatch, transfer: PeerTransfer, tokenizer, prompt_ids: PromptIds,
               score_rows: ScoreRows) -> None:
    """Re-tokenise every donor response, score them all in one pass under the receiver's
    pre-update weights (Eq. 7's receiver side and Eq. 9's pi_old) and admit them (Eqs. 7-8)."""
    step = batch.step
    own_rewards: dict[str, list[float]] = {}
    for r in step.rows(OWN):
        own_rewards.setdefault(step["prompt_id"][r], []).append(step["reward"][r])
    groups = list(step.groups_of(GRAFT))
    graft_rows = []
    for rows in groups:
        ids = prompt_ids(step["prompt"][rows[0]])
        train_rows = [TrainRow(ids, retokenize(tokenizer, step["response"][r], step["finished"][r]),
                               float(step["advantage"][r]), 1.0, True, prompt_id=step["prompt_id"][r]) for r in rows]
        for r, row in zip(rows, train_rows, strict=True):
            batch.tally.check_round_trip(tokenizer, step["response"][r], row.response_ids, step["finished"][r])
        graft_rows.append(train_rows)
    scored = iter(score_rows([row for rows in graft_rows for row in rows]))
    for rows, train_rows in zip(groups, graft_rows, strict=True):
        old = [next(scored) for _ in train_rows]
        receiver_mean = np.array([float(lp.mean()) if lp.numel() else -np.inf for lp in old])
        mine = np.asarray(own_rewards.get(step["prompt_id"][rows[0]], np.zeros(len(rows))), dtype=float)
        taken = transfer.admit(receiver_mean, _column(step, "mean_logp", rows), _column(step, "reward", rows),
                               _column(step, "advantage", rows), mine)
        gid = batch.new_group(True)
        for r, row, lp, w, advantage, offer, s in zip(rows, train_rows, old, taken.w, taken.advantages,
                                                     taken.offered, taken.s, strict=True):
            batch.tally.add(row.advantage, bool(offer), float(w), float(s))
            batch.n_tokens[r], batch.compat[r], batch.weight[r] = len(row.response_ids), float(s), float(w)
            batch.trained_advantage[r] = float(advantage)
            if w > 0:
                row.old_logp, row.weight, row.group, row.advantage = lp, float(w), gid, float(advantage)
                batch.rows.append(row)
                batch.refs[r] = row


def _column(step: StepBatch, name: str, rows: list[int]) -> np.ndarray:
    """One column over ``rows`` as floats (None: NaN)."""
    return np.array([np.nan if step[name][r] is None else step[name][r] for r in rows], dtype=float)


def add_peers(batch: ReceiverBatch, tokenizer, prompt_ids: PromptIds) -> dict[int, int]:
    """Every response of every peer group, re-tokenised, with the policy's advantages and the
    source's mean log-likelihood (the cross ratio's denominator). Each trained row gets a slot
    in the step's peer output (its s and weight at the update); returns batch row -> slot."""
    step = batch.step
    slots: dict[int, int] = {}
    for rows in step.groups_of(PEER):
        if all(step["mean_logp"][r] is None for r in rows):
            raise ValueError(f"peer group {step['source_model'][rows[0]]}/{step['prompt_id'][rows[0]]} has no "
                             "mean_logp (the source side)")
        ids = prompt_ids(step["prompt"][rows[0]])
        gid = batch.new_group(True)
        for r in rows:
            response = retokenize(tokenizer, step["response"][r], step["finished"][r])
            batch.tally.check_round_trip(tokenizer, step["response"][r], response, step["finished"][r])
            batch.n_tokens[r] = len(response)
            source = step["mean_logp"][r]
            if not response or source is None or not np.isfinite(source):
                continue  # nothing to train on
            row = TrainRow(ids, response, float(step["advantage"][r]), 1.0, True, False, gid, None,
                           source_mean=float(source), slot=len(slots), prompt_id=step["prompt_id"][r])
            slots[r] = row.slot
            batch.rows.append(row)
            batch.refs[r] = row
    return slots


def add_sgt(batch: ReceiverBatch, tokenizer, prompt_ids: PromptIds) -> None:
    """Each SGT item joins the group of the receiver's own (all-fail) group on its prompt, so it
    is trained in the same minibatch, as lambda x NLL added to that minibatch's RL loss
    (docs/algorithm.md section 3: "add lambda * NLL ... to the receiver's loss"); an item whose prompt
    has no own group in the training batch forms a group of its own."""
    step = batch.step
    own_group = {row.prompt_id: row.group for row in batch.rows if not row.is_peer}
    for r in step.rows(SGT):
        prompt_id = step["prompt_id"][r]
        gid = own_group[prompt_id] if prompt_id in own_group else batch.new_group(True)
        row = TrainRow(prompt_ids(step["prompt"][r]), retokenize(tokenizer, step["response"][r], step["finished"][r]),
                       0.0, 1.0, True, True, gid)
        batch.n_tokens[r], batch.weight[r] = step["source_tokens"][r], 1.0
        batch.rows.append(row)
        batch.refs[r] = row
