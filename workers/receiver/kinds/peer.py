"""``peer`` rows (HACPO): a donor's whole group ADDED next to the receiver's own on the same
prompt, with the advantages the policy gave; the sequence objective weighs each response by its
cross ratio (``workers.receiver.objective``)."""

from __future__ import annotations

import numpy as np
import torch

from graftpool.contracts import PEER, Route
from graftpool.step_record import StepRecord
from workers.receiver.kinds.base import (
    RowKind,
    TrainBatchBuilder,
    TrainerView,
    groups_of,
    register_kind,
)
from workers.receiver.receiver_batch import ReceiverBatch
from workers.receiver.retokenize import over_budget, retokenize


class Peer(RowKind):
    name, order, has_compat = PEER, 2, True

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        batch.add_rows(receiver, PEER, donor_rows, advantages=route.advantages)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        """Every response re-tokenised, with the source's mean log-likelihood (the cross ratio's
        denominator); each trained row gets a slot in the step's peer output (its ``slot`` column)."""
        step = rows.step
        for group in groups_of(step, PEER):
            if all(step["mean_logp"][r] is None for r in group):
                raise ValueError(f"peer group {step['source_model'][group[0]]}/{step['prompt_id'][group[0]]} has no "
                                 "mean_logp (the source side)")
            ids = view.prompt_ids(step["prompt"][group[0]])
            gid = rows.new_group(True)
            for r in group:
                response = retokenize(view.tokenizer, step["response"][r], step["finished"][r], view.end_id)
                rows.tally.check_round_trip(view.tokenizer, step["response"][r], response, step["finished"][r])
                rows["n_tokens"][r] = len(response)
                source = step["mean_logp"][r]
                if not response or source is None or not np.isfinite(source):
                    continue  # nothing to train on
                if over_budget(ids, response, view.max_row_tokens):
                    rows.tally.over_budget += 1
                    continue  # past the token budget: not trained (retokenize.over_budget)
                rows["weight"][r] = 1.0  # its loss weight; after the update, its effective weight
                rows.train(r, ids, response, gid, peer=True, source_mean=float(source), slot=rows.new_slot())

    def after_update(self, rows: ReceiverBatch, peer_out: torch.Tensor) -> None:
        """Each peer row's s and weight at its update (NaN, 0: it was not trained)."""
        for r in rows.step.where(kind=PEER):
            slot = rows["slot"][r]
            s, weight = (float(peer_out[slot, 0]), float(peer_out[slot, 1])) if slot >= 0 else (float("nan"), 0.0)
            rows["compat"][r], rows["weight"][r] = s, weight
            rows.tally.add(rows.step["advantage"][r], True, weight if np.isfinite(s) else 0.0, s)

    def step_metrics(self, batch: StepRecord) -> dict[str, float]:
        return {"exchange/peer_groups": float(len(groups_of(batch, PEER)))}

    def received(self, batch: StepRecord, failed: set[str]) -> int:
        """A peer group counts where it rescues an all-fail prompt (a non-zero advantage)."""
        return sum(1 for group in groups_of(batch, PEER) if batch["prompt_id"][group[0]] in failed
                   and any(batch["advantage"][r] != 0 for r in group))


register_kind(Peer())
