"""Every data-parallel rank runs the same forwards in each micro-batch (issue #51's second read).

A DeepSpeed ZeRO-3 forward gathers the partitioned weights collectively, layer by layer (and its
backward again), so ranks must agree on how many forwards a micro-batch takes: a rank with one
more pairs its gathers with its peers' backward ones, a hang under NCCL or a size mismatch. A
micro-batch of three RL rows and one SGT row (``exchange: sgt``) gave rank 0 two forwards (RL
rows 0 and 2, the SGT row) and rank 1 one (RL row 1). Two real trainer ranks of a tiny model
count their backbone's forwards here; no process group is needed for one micro-batch's loss."""

from __future__ import annotations

import torch

from workers.training.batching import TrainRow
from workers.training.trainer import TorchTrainer


def test_ranks_run_the_same_forwards_for_a_micro_batch_with_sgt_rows(paths):
    ranks = [TorchTrainer(paths["gpt2-bpe"], rank=r, world_size=2, seed=0, lr=1e-3) for r in range(2)]
    tokenizer = ranks[0].tokenizer

    def row(prompt: str, response: str, **kind) -> TrainRow:
        ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        return TrainRow(ranks[0]._prompt_ids(prompt), ids, prompt_id=prompt, **kind)

    rows = [row("What is 1+1?", "2", advantage=1.0), row("What is 2+2?", "5", advantage=-1.0, group=1),
            row("What is 3+3?", "6", advantage=0.5, group=2),
            row("What is 4+4?", "The answer is 8.", is_sgt=True, group=3)]
    forwards, losses = [], []
    for trainer in ranks:
        calls = []
        hook = trainer.model.base_model.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        normaliser = float(sum(len(r.response_ids) for r in rows if not r.is_sgt))
        loss, _ = trainer._micro_loss(rows, rows, trainer.token_objective, 0, normaliser,
                                      torch.zeros((0, 2), dtype=torch.float64))
        hook.remove()
        loss.backward()  # a zero-weight forward still reaches the weights' graph, with a zero gradient
        forwards.append(len(calls))
        losses.append(loss)
    assert forwards[0] == forwards[1] == 2, forwards
    assert all(torch.isfinite(loss) for loss in losses)
