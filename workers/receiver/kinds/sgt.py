"""``sgt`` rows (the SGT baseline): one correct peer response on a receiver's all-fail prompt,
as lambda x NLL added to the RL loss of the minibatch that holds the receiver's own group on
that prompt (docs/algorithm.md section 3: "add lambda * NLL ... to the receiver's loss"); an
item whose prompt has no own group in the training batch forms a group of its own."""

from __future__ import annotations

from graftpool.contracts import SGT, RolloutGroup, Route
from graftpool.step_batch import StepBatch, value_at
from workers.receiver.kinds.base import RowKind, TrainerView, register_kind
from workers.receiver.receiver_batch import ReceiverBatch
from workers.training.batching import TrainRow, retokenize


def add_sgt_row(batch: StepBatch, prompt: str, response: str, finished: bool = True, prompt_id: str = "",
                source: RolloutGroup | None = None, sample: int = -1, donor: str = "") -> None:
    """One SGT row; ``source``: the donor group the response comes from (its reward, source-side
    log-likelihood and length go to the store), None for a free-standing text."""
    batch.add_row(kind=SGT, group=batch.new_group(), source_model=donor or (source.model if source else ""),
                  prompt_id=prompt_id, sample=sample, prompt=prompt, response=response, token_ids=None,
                  finished=finished, reward=float(source.rewards[sample]) if source else float("nan"),
                  advantage=0.0, mean_logp=value_at(source.mean_logp, sample) if source else None,
                  policy_version=source.policy_version if source else 0, reason="",
                  source_tokens=len(source.token_ids[sample]) if source and source.token_ids else 0)


class SupervisedPeer(RowKind):
    name, order = SGT, 3

    def plan(self, batch: StepBatch, route: Route, donor_group: RolloutGroup, donor: str) -> None:
        for i in route.samples or ():
            finished = donor_group.finished[i] if donor_group.finished else True
            add_sgt_row(batch, donor_group.prompt, donor_group.responses[i], finished, donor_group.prompt_id,
                        donor_group, i, donor)

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        step = rows.step
        own_group = {row.prompt_id: row.group for row in rows.rows if not row.is_peer}
        for r in step.rows(SGT):
            prompt_id = step["prompt_id"][r]
            gid = own_group[prompt_id] if prompt_id in own_group else rows.new_group(True)
            row = TrainRow(view.prompt_ids(step["prompt"][r]),
                           retokenize(view.tokenizer, step["response"][r], step["finished"][r]), 0.0, 1.0, True, True,
                           gid)
            rows.n_tokens[r], rows.weight[r] = step["source_tokens"][r], 1.0
            rows.rows.append(row)
            rows.refs[r] = row

    def received(self, batch: StepBatch, failed: set[str]) -> int:
        return len(batch.rows(SGT))


register_kind(SupervisedPeer())
