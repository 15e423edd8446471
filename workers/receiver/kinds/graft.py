"""``graft`` rows: a donor's whole group on a prompt where the receiver failed every response
(Eq. 4) replaces the receiver's own group (docs/algorithm.md section 2, step 6). Each response is
re-tokenised by the receiver, scored under its pre-update weights (Eq. 7's receiver side and
Eq. 9's pi_old) and admitted through the gate (Eqs. 7-8, ``workers.receiver.peer_transfer``)."""

from __future__ import annotations

import numpy as np

from graftpool.contracts import GRAFT, OWN, RolloutGroup, Route
from graftpool.step_batch import StepBatch
from workers.receiver.kinds.base import RowKind, TrainerView, register_kind
from workers.receiver.receiver_batch import ReceiverBatch, float_column
from workers.training.batching import TrainRow, retokenize


class Graft(RowKind):
    name, order, replaces_own, has_compat = GRAFT, 1, True, True

    def plan(self, batch: StepBatch, route: Route, donor_group: RolloutGroup, donor: str) -> None:
        batch.add_group(GRAFT, donor_group, source=donor)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        step = rows.step
        own_rewards: dict[str, list[float]] = {}
        for r in step.rows(OWN):
            own_rewards.setdefault(step["prompt_id"][r], []).append(step["reward"][r])
        groups = list(step.groups_of(GRAFT))
        train_rows = []
        for group in groups:
            ids = view.prompt_ids(step["prompt"][group[0]])
            made = [TrainRow(ids, retokenize(view.tokenizer, step["response"][r], step["finished"][r]),
                             float(step["advantage"][r]), 1.0, True, prompt_id=step["prompt_id"][r]) for r in group]
            for r, row in zip(group, made, strict=True):
                rows.tally.check_round_trip(view.tokenizer, step["response"][r], row.response_ids, step["finished"][r])
            train_rows.append(made)
        scored = iter(view.score_rows([row for made in train_rows for row in made]))  # one pass for all
        for group, made in zip(groups, train_rows, strict=True):
            old = [next(scored) for _ in made]
            receiver_mean = np.array([float(lp.mean()) if lp.numel() else -np.inf for lp in old])
            mine = np.asarray(own_rewards.get(step["prompt_id"][group[0]], np.zeros(len(group))), dtype=float)
            taken = view.transfer.admit(receiver_mean, float_column(step, "mean_logp", group),
                                        float_column(step, "reward", group), float_column(step, "advantage", group),
                                        mine)
            gid = rows.new_group(True)
            for r, row, lp, w, advantage, offer, s in zip(group, made, old, taken.w, taken.advantages, taken.offered,
                                                         taken.s, strict=True):
                rows.tally.add(row.advantage, bool(offer), float(w), float(s))
                rows.n_tokens[r], rows.compat[r], rows.weight[r] = len(row.response_ids), float(s), float(w)
                rows.trained_advantage[r] = float(advantage)
                if w > 0:
                    row.old_logp, row.weight, row.group, row.advantage = lp, float(w), gid, float(advantage)
                    rows.rows.append(row)
                    rows.refs[r] = row

    def received(self, batch: StepBatch, failed: set[str]) -> int:
        return sum(1 for _ in batch.groups_of(GRAFT))


register_kind(Graft())
