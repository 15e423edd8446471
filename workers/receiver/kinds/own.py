"""``own`` rows: the receiver's own groups, trained with their GRPO advantages (Eq. 1), or with
the advantages of an ``own`` route (HACPO re-weights a learner's own group); a group whose
prompt another kind replaces (a graft, docs/algorithm.md section 2, step 6) is not trained."""

from __future__ import annotations

import numpy as np

from graftpool.contracts import OWN, RolloutGroup, Route
from graftpool.step_batch import StepBatch
from workers.receiver.kinds.base import ROW_KINDS, RowKind, TrainerView, register_kind
from workers.receiver.receiver_batch import ReceiverBatch
from workers.training.batching import TrainRow


class Own(RowKind):
    name, order = OWN, 0

    def plan(self, batch: StepBatch, route: Route, donor_group: RolloutGroup, donor: str) -> None:
        """An ``own`` route: the receiver's own group on the prompt (already in the batch) takes
        the route's advantages."""
        if route.donor != route.receiver or route.advantages is None:
            raise ValueError("an 'own' route re-weights the receiver's own group: donor == receiver, with advantages")
        rows = [r for r in batch.rows(OWN) if batch["prompt_id"][r] == donor_group.prompt_id]
        for r, advantage in zip(rows, np.asarray(route.advantages, dtype=float), strict=True):
            batch["advantage"][r] = float(advantage)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        """The own groups not replaced; ``view.old_logps`` None: exactly on-policy (pi_old =
        sg(pi_theta) in the loss, ``workers.training.sampling_logprobs``)."""
        step = rows.step
        replaced = {step["prompt_id"][r] for kind in ROW_KINDS.names() if ROW_KINDS.get(kind).replaces_own
                    for r in step.rows(kind)}
        for group in step.groups_of(OWN):
            for r in group:
                rows.n_tokens[r], rows.weight[r] = len(step["token_ids"][r]), 1.0
            if step["prompt_id"][group[0]] in replaced:
                continue
            ids = view.prompt_ids(step["prompt"][group[0]])
            gid = rows.new_group(False)
            for r in group:
                prompt_id, sample = step["prompt_id"][r], step["sample"][r]
                old = view.old_logps[(prompt_id, sample)] if view.old_logps is not None else None
                row = TrainRow(ids, list(step["token_ids"][r]), float(step["advantage"][r]), 1.0, False, False, gid,
                               old, prompt_id=prompt_id)
                rows.rows.append(row)
                rows.refs[r] = row


register_kind(Own())
