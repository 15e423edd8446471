"""``own`` rows: the receiver's own groups, trained with their GRPO advantages (Eq. 1), or with
the advantages of an ``own`` route (HACPO re-weights a learner's own group); a group whose
prompt another kind replaces (a graft, docs/algorithm.md section 2, "Replacement") is not trained."""

from __future__ import annotations

import torch

from graftpool.contracts import OWN, Route
from workers.receiver.kinds.base import (
    ROW_KINDS,
    RowKind,
    TrainBatchBuilder,
    TrainerView,
    groups_of,
    register_kind,
)
from workers.receiver.receiver_batch import ReceiverBatch


class Own(RowKind):
    name, order = OWN, 0

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        """An ``own`` route: the receiver's own group on the prompt (already in the batch) takes
        the route's advantages."""
        if route.donor != route.receiver or route.advantages is None:
            raise ValueError("an 'own' route re-weights the receiver's own group: donor == receiver, with advantages")
        batch.reweight(receiver, OWN, batch.record["prompt_id"][donor_rows[0]], route.advantages)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        """The own groups not replaced; pi_old is the record's ``old_logp`` (recomputed before
        routing, or the behaviour log-probs), or with ``view.takes_old_logp`` False exactly
        on-policy (pi_old = sg(pi_theta) in the loss, ``workers.training.sampling_logprobs``)."""
        step = rows.step
        replaced = {step["prompt_id"][r] for kind in ROW_KINDS.names() if ROW_KINDS.get(kind).replaces_own
                    for r in step.where(kind=kind)}
        for group in groups_of(step, OWN):
            for r in group:
                rows["n_tokens"][r], rows["weight"][r] = len(step["token_ids"][r]), 1.0
            if step["prompt_id"][group[0]] in replaced:
                continue
            ids = view.prompt_ids(step["prompt"][group[0]])
            gid = rows.new_group(False)
            for r in group:
                old = torch.tensor(step["old_logp"][r]) if view.takes_old_logp else None
                rows.train(r, ids, step["token_ids"][r], gid, old_logp=old)


register_kind(Own())
