"""A receiver's training batch for one step: its own groups, grafted groups through the gate,
added peer groups (HACPO) and SGT items, as :class:`workers.training.batching.TrainRow` rows.

What reaches the trainer (``TorchTrainer.train``):

- ``own``: the receiver's groups, trained with their ``advantages`` unless a graft replaces
  the group (docs/algorithm.md section 2, step 6);
- :class:`Graft`: a donor group that replaces an all-fail own group; each response is
  re-tokenised, scored under the receiver's pre-update weights and admitted by
  ``workers.receiver.peer_transfer`` (the gate, Eqs. 7-8);
- :class:`PeerGroup`: a donor group ADDED to the receiver's own (HACPO), with the
  advantages the policy gave; the sequence objective weighs it (``workers.receiver.objective``);
- :class:`SGTItem`: one correct peer response as an NLL term (the SGT baseline).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from graftpool.contracts import RolloutGroup
from workers.receiver.peer_transfer import PeerTransfer
from workers.training.batching import TrainRow, retokenize, round_trips


@dataclass
class Graft:
    """A donor group routed to this receiver for one prompt (its own group is replaced)."""

    group: RolloutGroup  # the donor's group, with its advantages and mean_logp (Eq. 6 source side)
    finished: list[bool] = field(default_factory=list)


@dataclass
class PeerGroup:
    """A donor group added next to the receiver's own group on the same prompt (HACPO)."""

    group: RolloutGroup  # with mean_logp: the source side l^j of the cross ratio
    advantages: list[float]  # what the receiver trains each response with
    finished: list[bool] = field(default_factory=list)


@dataclass
class SGTItem:
    """One correct peer response added as an NLL term (the SGT baseline) on the receiver's
    all-fail prompt ``prompt_id`` (empty: an item of its own, in no own group's minibatch)."""

    prompt: str
    response: str
    finished: bool = True
    prompt_id: str = ""


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
    """Rows and their group index (``group_is_peer[row.group]``), plus per-graft gate output."""

    rows: list[TrainRow] = field(default_factory=list)
    group_is_peer: list[bool] = field(default_factory=list)
    graft_compat: list[list[float]] = field(default_factory=list)
    graft_weight: list[list[float]] = field(default_factory=list)
    graft_tokens: list[list[int]] = field(default_factory=list)
    graft_advantage: list[list[float]] = field(default_factory=list)
    peer_tokens: list[list[int]] = field(default_factory=list)
    tally: GateTally = field(default_factory=GateTally)
    # the rows each input became (None: a response that never entered the batch), so that the
    # optimizer update that trained each one (``TrainRow.update``) can be reported back
    own_refs: dict[str, list[TrainRow]] = field(default_factory=dict)
    graft_refs: list[list[TrainRow | None]] = field(default_factory=list)
    peer_refs: list[list[TrainRow | None]] = field(default_factory=list)
    sgt_refs: list[TrainRow] = field(default_factory=list)

    @property
    def peer_slots(self) -> list[list[int]]:
        """The slot of each peer response in the step's peer output (-1: it had no tokens)."""
        return [[-1 if row is None else row.slot for row in refs] for refs in self.peer_refs]

    def new_group(self, is_peer: bool) -> int:
        self.group_is_peer.append(is_peer)
        return len(self.group_is_peer) - 1

    def updates(self) -> tuple[dict[str, int], list[list[int]], list[list[int]], list[int]]:
        """The update index of each own group (by prompt id), each grafted and peer response
        and each SGT item; -1 where nothing was trained."""
        def index(row: TrainRow | None) -> int:
            return -1 if row is None else row.update
        own = {pid: max((r.update for r in rows), default=-1) for pid, rows in self.own_refs.items()}
        return (own, [[index(r) for r in refs] for refs in self.graft_refs],
                [[index(r) for r in refs] for refs in self.peer_refs], [index(r) for r in self.sgt_refs])


PromptIds = Callable[[str], list[int]]
ScoreRows = Callable[[list[TrainRow]], list[torch.Tensor]]


def add_own(batch: ReceiverBatch, own: list[RolloutGroup], replaced: set[str], prompt_ids: PromptIds,
            old_logps: dict[tuple[str, int], torch.Tensor] | None) -> None:
    """The receiver's own groups not replaced by a graft; ``old_logps`` None: exactly on-policy
    (pi_old = sg(pi_theta) in the loss, ``workers.training.sampling_logprobs``)."""
    for group in own:
        if group.prompt_id in replaced:
            continue
        ids = prompt_ids(group.prompt)
        gid = batch.new_group(False)
        rows = [TrainRow(ids, list(tokens), float(group.advantages[i]), 1.0, False, False, gid,
                         old_logps[(group.prompt_id, i)] if old_logps is not None else None,
                         prompt_id=group.prompt_id)
                for i, tokens in enumerate(group.token_ids)]
        batch.rows += rows
        batch.own_refs[group.prompt_id] = rows


def add_grafts(batch: ReceiverBatch, grafts: list[Graft], own: list[RolloutGroup], transfer: PeerTransfer,
               tokenizer, prompt_ids: PromptIds, score_rows: ScoreRows) -> None:
    """Re-tokenise every donor response, score them all in one pass under the receiver's
    pre-update weights (Eq. 7's receiver side and Eq. 9's pi_old) and admit them (Eqs. 7-8)."""
    own_rewards = {g.prompt_id: np.asarray(g.rewards, dtype=float) for g in own}
    graft_rows = []
    for graft in grafts:
        donor = graft.group
        finished = graft.finished or [True] * donor.n
        ids = prompt_ids(donor.prompt)
        rows = [TrainRow(ids, retokenize(tokenizer, text, done), float(adv), 1.0, True, prompt_id=donor.prompt_id)
                for text, done, adv in zip(donor.responses, finished, donor.advantages, strict=True)]
        for row, text, done in zip(rows, donor.responses, finished, strict=True):
            batch.tally.check_round_trip(tokenizer, text, row.response_ids, done)
        graft_rows.append(rows)
    scored = iter(score_rows([row for rows in graft_rows for row in rows]))
    for graft, peer_rows in zip(grafts, graft_rows, strict=True):
        donor = graft.group
        old = [next(scored) for _ in peer_rows]
        receiver_mean = np.array([float(lp.mean()) if lp.numel() else -np.inf for lp in old])
        mine = own_rewards.get(donor.prompt_id, np.zeros(donor.n))
        taken = transfer.admit(receiver_mean, donor.mean_logp, donor.rewards, donor.advantages, mine)
        batch.graft_compat.append(taken.s.tolist())
        batch.graft_weight.append(taken.w.tolist())
        batch.graft_advantage.append(taken.advantages.tolist())
        batch.graft_tokens.append([len(r.response_ids) for r in peer_rows])
        gid = batch.new_group(True)
        refs: list[TrainRow | None] = []
        for row, lp, weight, advantage, offer, s in zip(peer_rows, old, taken.w, taken.advantages, taken.offered,
                                                        taken.s, strict=True):
            batch.tally.add(row.advantage, bool(offer), float(weight), float(s))
            if weight > 0:
                row.old_logp, row.weight, row.group, row.advantage = lp, float(weight), gid, float(advantage)
                batch.rows.append(row)
            refs.append(row if weight > 0 else None)
        batch.graft_refs.append(refs)


def add_peers(batch: ReceiverBatch, peers: list[PeerGroup], tokenizer, prompt_ids: PromptIds) -> int:
    """Every response of every peer group, re-tokenised, with the policy's advantages and the
    source's mean log-likelihood (the cross ratio's denominator). Each gets a slot in the
    step's peer output (its s and weight at the update); returns the number of slots."""
    slots = 0
    for peer in peers:
        donor = peer.group
        finished = peer.finished or [True] * donor.n
        if donor.mean_logp is None:
            raise ValueError(f"peer group {donor.model}/{donor.prompt_id} has no mean_logp (the source side)")
        ids = prompt_ids(donor.prompt)
        gid = batch.new_group(True)
        tokens, refs = [], []
        for text, done, adv, source in zip(donor.responses, finished, peer.advantages, donor.mean_logp, strict=True):
            response = retokenize(tokenizer, text, done)
            batch.tally.check_round_trip(tokenizer, text, response, done)
            tokens.append(len(response))
            if not response or not np.isfinite(source):
                refs.append(None)  # nothing to train on
                continue
            row = TrainRow(ids, response, float(adv), 1.0, True, False, gid, None,
                           source_mean=float(source), slot=slots, prompt_id=donor.prompt_id)
            batch.rows.append(row)
            refs.append(row)
            slots += 1
        batch.peer_tokens.append(tokens)
        batch.peer_refs.append(refs)
    return slots


def add_sgt(batch: ReceiverBatch, items: list[SGTItem], tokenizer, prompt_ids: PromptIds) -> None:
    """Each SGT item joins the group of the receiver's own (all-fail) group on its prompt, so it
    is trained in the same minibatch, as lambda x NLL added to that minibatch's RL loss
    (docs/algorithm.md section 3: "add lambda * NLL ... to the receiver's loss"); an item whose prompt
    has no own group in the batch forms a group of its own."""
    for item in items:
        own = batch.own_refs.get(item.prompt_id)
        gid = own[0].group if own else batch.new_group(True)
        row = TrainRow(prompt_ids(item.prompt), retokenize(tokenizer, item.response, item.finished),
                       0.0, 1.0, True, True, gid)
        batch.rows.append(row)
        batch.sgt_refs.append(row)
