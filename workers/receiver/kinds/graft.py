"""``graft`` rows: a donor's whole group on a prompt where the receiver failed every response
(Eq. 4) replaces the receiver's own group (docs/algorithm.md section 2, "Replacement"). Each response is
re-tokenised by the receiver, scored under its pre-update weights (Eq. 7's receiver side and
Eq. 9's pi_old) and admitted through the gate (Eqs. 7-8, ``workers.receiver.peer_transfer``).
Every graft row also gets ln s split into its answer span, the rest and EOS
(``workers.receiver.gate_split``), from the same per-token log-probs."""

from __future__ import annotations

import math

import numpy as np
import torch

from graftpool.contracts import GRAFT, OWN, Route
from graftpool.step_record import StepRecord
from workers.receiver.gate_kinds import answer_start, donor_logp, gate_inputs
from workers.receiver.gate_split import SPLIT_COLUMNS, split_log_s
from workers.receiver.kinds.base import (
    RowKind,
    TrainBatchBuilder,
    TrainerView,
    groups_of,
    register_kind,
)
from workers.receiver.receiver_batch import ReceiverBatch, float_column
from workers.receiver.retokenize import over_budget, retokenize, token_rows


class Graft(RowKind):
    name, order, replaces_own, has_compat, donor_tokens = GRAFT, 1, True, True, True
    outcome_columns = {name: (None, "double") for name in SPLIT_COLUMNS}  # null where a row has no part

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        batch.add_rows(receiver, GRAFT, donor_rows)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        step = rows.step
        own_rewards: dict[str, list[float]] = {}
        for r in step.where(kind=OWN):
            own_rewards.setdefault(step["prompt_id"][r], []).append(step["reward"][r])
        groups = groups_of(step, GRAFT)
        ids, responses = {}, {}
        for group in groups:
            ids[group[0]] = view.prompt_ids(step["prompt"][group[0]])
            for r in group:
                responses[r] = retokenize(view.tokenizer, step["response"][r], step["finished"][r], view.end_id)
                rows.tally.check_round_trip(view.tokenizer, step["response"][r], responses[r], step["finished"][r])
        # pi_old of each response under the receiver's pre-update weights: from the compatibility
        # pass where the receiver scored it there (``receiver_logp``), else one pass for all the rest;
        # a row past the token budget is not scored: NaN, so s is NaN and w 0 (retokenize.over_budget)
        known = step.get("receiver_logp")
        unscored = {r for group in groups for r in group
                    if over_budget(ids[group[0]], responses[r], view.max_row_tokens)}
        rows.tally.over_budget += len(unscored)
        todo = [(group[0], r) for group in groups for r in group if known[r] is None and r not in unscored]
        scored = iter(view.score_rows(token_rows([ids[g] for g, _ in todo], [responses[r] for _, r in todo])))
        for group in groups:
            old = [torch.full((len(responses[r]),), float("nan")) if r in unscored
                   else next(scored) if known[r] is None else torch.tensor(known[r]) for r in group]
            mine = np.asarray(own_rewards.get(step["prompt_id"][group[0]], np.zeros(len(group))), dtype=float)
            gate_in = gate_inputs(view.transfer.gate_kind, view.tokenizer, step, group, old,
                                  [responses[r] for r in group])
            taken = view.transfer.admit(gate_in, float_column(step, "reward", group),
                                        float_column(step, "advantage", group), mine)
            gid = rows.new_group(True)
            for r, lp, w, advantage, offer, s in zip(group, old, taken.w, taken.advantages, taken.offered, taken.s,
                                                     strict=True):
                rows.tally.add(float(step["advantage"][r]), bool(offer), float(w), float(s))
                rows["n_tokens"][r], rows["compat"][r], rows["weight"][r] = len(responses[r]), float(s), float(w)
                rows["trained_advantage"][r] = float(advantage)
                self.add_split(rows, view, r, lp, responses[r])
                if w > 0:
                    rows.train(r, ids[group[0]], responses[r], gid, peer=True, old_logp=lp)

    @staticmethod
    def add_split(rows: ReceiverBatch, view: TrainerView, r: int, old, response_ids: list[int]) -> None:
        """Row ``r``'s ln s split (``gate_split``): B's ``old`` on its ``response_ids``, A's
        per-token log-probs and answer start from the record (``answer_start``)."""
        step = rows.step
        parts = split_log_s(old, answer_start(view.tokenizer, response_ids, step["response"][r]),
                            donor_logp(step, r), step.get("answer_start")[r], bool(step["finished"][r]))
        for name, value in zip(SPLIT_COLUMNS, parts, strict=True):  # a NaN part is stored null
            rows[name][r] = None if math.isnan(value) else float(value)

    def received(self, batch: StepRecord, failed: set[str]) -> int:
        return len(groups_of(batch, GRAFT))


register_kind(Graft())
