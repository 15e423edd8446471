"""Every data-parallel rank runs the same forwards in each micro-batch, and a scoring forward
holds one rank's token budget (issue #51's second read).

A DeepSpeed ZeRO-3 forward gathers the partitioned weights collectively, layer by layer (and its
backward again), so ranks must agree on how many forwards a micro-batch takes: a rank with one
more pairs its gathers with its peers' backward ones, a hang under NCCL or a size mismatch. A
micro-batch of three RL rows and one SGT row (``exchange: sgt``) gave rank 0 two forwards (RL
rows 0 and 2, the SGT row) and rank 1 one (RL row 1). Two real trainer ranks of a tiny model
count their backbone's forwards here; no process group is needed for one micro-batch's loss."""

from __future__ import annotations

import torch

from graftpool.step_record import StepRecord
from workers.receiver.receiver_batch import POLICY
from workers.receiver.retokenize import token_rows
from workers.training.trainer import TorchTrainer


def test_ranks_run_the_same_forwards_for_a_micro_batch_with_sgt_rows(paths):
    ranks = [TorchTrainer(paths["gpt2-bpe"], rank=r, world_size=2, seed=0, lr=1e-3) for r in range(2)]
    tokenizer = ranks[0].tokenizer

    def row(prompt: str, response: str, advantage: float = 0.0, term: str = POLICY) -> dict:
        ids = tokenizer(response, add_special_tokens=False)["input_ids"]
        return {"prompt_ids": ranks[0]._prompt_ids(prompt), "response_ids": ids, "prompt_id": prompt,
                "trained_advantage": advantage, "weight": 1.0, "peer": term != POLICY, "term": term,
                "old_logp": None, "source_mean": float("nan"), "slot": -1}

    rows = StepRecord.from_rows([row("What is 1+1?", "2", 1.0), row("What is 2+2?", "5", -1.0),
                                 row("What is 3+3?", "6", 0.5), row("What is 4+4?", "The answer is 8.", term="sgt")])
    forwards, losses = [], []
    for trainer in ranks:
        calls = []
        hook = trainer.model.base_model.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        normaliser = float(sum(len(rows["response_ids"][i]) for i in rows.where(term=POLICY)))
        loss, _ = trainer._micro_loss(rows, rows, trainer.token_objective, 0, normaliser,
                                      torch.zeros((0, 2), dtype=torch.float64))
        hook.remove()
        loss.backward()  # a zero-weight forward still reaches the weights' graph, with a zero gradient
        forwards.append(len(calls))
        losses.append(loss)
    assert forwards[0] == forwards[1] == 2, forwards
    assert all(torch.isfinite(loss) for loss in losses)


def test_a_scoring_forward_holds_one_ranks_token_budget(paths):
    """``max_tokens_per_micro_batch`` is a rank's: the update packs world_size times it, since each
    rank takes every world_size-th row, but every rank scores every row (pi_old, the gate), and
    scoring packed world_size budgets into one forward: with ZeRO-3's whole-vocabulary logits on 8
    ranks, 8 x 5,120 tokens x 152 k x 10 bytes is 62 GB a forward. Four ranks' rank 0 here, its
    backbone's forwards measured in padded tokens (rows x longest row)."""
    trainer = TorchTrainer(paths["gpt2-bpe"], rank=0, world_size=4, seed=0, share_prompts=False)
    tokenizer = trainer.tokenizer
    rows = token_rows([trainer._prompt_ids(f"What is {i} + {i}?") for i in range(16)],
                      [tokenizer(f"{i} + {i} is {2 * i}.", add_special_tokens=False)["input_ids"] for i in range(16)])
    longest = max(len(p) + len(r) for p, r in zip(rows["prompt_ids"], rows["response_ids"], strict=True))
    budget = 2 * longest
    trainer = TorchTrainer(paths["gpt2-bpe"], rank=0, world_size=4, seed=0, share_prompts=False,
                           max_tokens_per_micro_batch=budget)
    sizes: list[int] = []
    trainer.model.base_model.register_forward_pre_hook(
        lambda _, args, kwargs: sizes.append(kwargs["input_ids"].numel()), with_kwargs=True)
    scored = trainer.score_rows(rows)
    assert [len(s) for s in scored] == [len(r) for r in rows["response_ids"]]
    assert len(sizes) >= 8 and max(sizes) <= budget, (budget, sizes)


def test_an_update_forward_holds_one_ranks_token_budget(paths):
    """The update packed world_size budgets into a micro-batch and each rank took every
    world_size-th row, so a rank took ceil(rows / world_size) of them: three rows of length L under
    2 x 1.6 L gave rank 0 two, a 2 L forward over a 1.6 L budget (8 ranks: up to 1.8 budgets; issue
    #51's fifth read). Two ranks' forwards in each micro-batch of the update, measured in padded
    tokens (rows x longest row), as in the update's ``_micro_loss``."""
    ranks = [TorchTrainer(paths["gpt2-bpe"], rank=r, world_size=2, seed=0, lr=1e-3) for r in range(2)]
    tokenizer = ranks[0].tokenizer
    prompts = [f"What is {i} + {i}?" for i in range(1, 4)]
    answers = [tokenizer(f"{i} + {i} is {2 * i}.", add_special_tokens=False)["input_ids"] for i in range(1, 4)]
    rows = token_rows([ranks[0]._prompt_ids(p) for p in prompts], answers).with_columns(
        prompt_id=prompts, trained_advantage=[1.0, -1.0, 0.5], weight=[1.0] * 3, peer=[False] * 3,
        term=[POLICY] * 3, old_logp=[None] * 3, source_mean=[float("nan")] * 3, slot=[-1] * 3)
    lengths = [len(p) + len(r) for p, r in zip(rows["prompt_ids"], rows["response_ids"], strict=True)]
    assert len(set(lengths)) == 1
    budget = int(1.6 * lengths[0])
    sizes: list[int] = []
    for trainer in ranks:
        trainer.settings = trainer.settings.with_changes(max_tokens_per_micro_batch=budget)
        trainer.model.base_model.register_forward_pre_hook(
            lambda _, args, kwargs: sizes.append(kwargs["input_ids"].numel()), with_kwargs=True)
        for micro in trainer._micro_batches(rows, 1):
            part = rows.select(micro)
            trainer._micro_loss(part, rows, trainer.token_objective, 0, float(sum(lengths)),
                                torch.zeros((0, 2), dtype=torch.float64))
    assert sizes and max(sizes) <= budget, (budget, sizes)
