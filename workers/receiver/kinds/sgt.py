"""``sgt`` rows (the SGT baseline): one correct peer response on a receiver's all-fail prompt,
as lambda x NLL added to the RL loss of the minibatch that holds the receiver's own group on
that prompt (docs/algorithm.md section 3, SGT: "is added to the receiver's loss as" lambda x NLL); an
item whose prompt has no own group in the training batch forms a group of its own."""

from __future__ import annotations

import torch

from graftpool.contracts import SGT, Route
from graftpool.step_record import StepRecord
from workers.receiver.kinds.base import RowKind, TrainBatchBuilder, TrainerView, register_kind
from workers.receiver.objective import sgt_loss
from workers.receiver.receiver_batch import ReceiverBatch
from workers.receiver.retokenize import over_budget, retokenize


class SupervisedPeer(RowKind):
    name, order = SGT, 3

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        """Each of the route's ``samples`` (indices into the donor's group) as a row of its own
        group, trained with no advantage."""
        for i in route.samples or ():
            batch.add_rows(receiver, SGT, [donor_rows[i]], advantages=[0.0])

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        step = rows.step
        own_group = {step["prompt_id"][r]: rows["train_group"][r] for r in rows.trained_rows() if not rows["peer"][r]}
        for r in step.where(kind=SGT):
            prompt_id = step["prompt_id"][r]
            ids = view.prompt_ids(step["prompt"][r])
            response = retokenize(view.tokenizer, step["response"][r], step["finished"][r], view.end_id)
            rows.tally.check_round_trip(view.tokenizer, step["response"][r], response, step["finished"][r])
            rows["n_tokens"][r], rows["weight"][r] = len(response), 1.0  # its length in the receiver's tokens
            if over_budget(ids, response, view.max_row_tokens):  # not trained (retokenize.over_budget)
                rows.tally.over_budget += 1
                rows["weight"][r] = 0.0
                continue
            gid = own_group[prompt_id] if prompt_id in own_group else rows.new_group(True)
            rows.train(r, ids, response, gid, peer=True, term=SGT)

    def loss(self, logp: torch.Tensor, mask: torch.Tensor, rows: StepRecord, settings) -> torch.Tensor:
        """lambda (``sgt_coef``) x the token-mean NLL of each row, averaged over the rows."""
        return sgt_loss(logp, mask, settings.sgt_coef)

    def received(self, batch: StepRecord, failed: set[str]) -> int:
        return len(batch.where(kind=SGT))


register_kind(SupervisedPeer())
