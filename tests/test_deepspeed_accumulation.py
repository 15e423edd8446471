"""A DeepSpeed ZeRO-3 bf16 rank (the GPU template's trainer) sums a minibatch's micro-batch
gradients in fp32, as the torch backend's ``bf16-mixed`` does: the sum does not depend on how the
minibatch is cut into micro-batches beyond each micro-batch's own bf16 gradient
(``workers.training.deepspeed_trainer.deepspeed_config``). Runs in ``.venv-scale``; elsewhere it
skips."""

from __future__ import annotations

import pytest
import torch

from tests.scale_setup import needs_deepspeed
from tests.test_scale_deepspeed import _deepspeed_ranks

pytestmark = pytest.mark.slow

PARTS = 32  # a power of two: a 32nd of a bf16 gradient is exact, and so is the fp32 sum of 32 of them


def _summed_gradient(trainer, parts: int) -> list[torch.Tensor]:
    """Inside a rank: one row's loss in ``parts`` micro-batches of 1 / ``parts`` of it (a backward
    each, as the update runs them), and the minibatch's gradient the engine then holds, each
    parameter's in fp32 (DeepSpeed's ``safe_get_full_grad``)."""
    from deepspeed.utils import safe_get_full_grad

    from workers.receiver.retokenize import token_rows

    rows = token_rows([[5, 6, 7, 8]], [[9, 10, 11, 12, 13, 14]])
    trainer.engine.optimizer.zero_grad()
    for _ in range(parts):
        logp, mask = trainer._logprobs(rows)
        trainer._backward((logp * mask).sum() / parts)
    return [safe_get_full_grad(p).clone() for p in trainer.engine.module.parameters()]


@needs_deepspeed
def test_a_zero3_bf16_rank_sums_a_minibatchs_micro_batches_in_fp32(ray_local, h64_path):
    """The row's loss in 32 micro-batches of a 32nd gives the gradient of the row's loss in one,
    exactly: each 32nd is exact in bf16 and so is their sum in fp32. Summed in bf16 (DeepSpeed's
    default for a bf16 model), every partial sum is rounded to 8 significant bits and no
    parameter's gradient comes out equal (up to 2.8 % of a tensor's largest element off)."""
    ranks, _ = _deepspeed_ranks(ray_local, h64_path, 1, precision="bf16-mixed",
                                deepspeed={"zero_stage": 3, "param_persistence_threshold": 0})
    rank = ranks[0]
    one = ray_local.get(rank.__ray_call__.remote(_summed_gradient, 1))
    summed = ray_local.get(rank.__ray_call__.remote(_summed_gradient, PARTS))
    assert all(g.abs().max() > 0 for g in one)  # a real gradient in every parameter
    off = [i for i, (a, b) in enumerate(zip(one, summed, strict=True)) if not torch.equal(a, b)]
    assert not off, f"{len(off)} of {len(one)} parameters' gradients depend on the micro-batch split"
    ray_local.kill(rank)
