"""``models[].trainer.gradient_checkpointing`` (issue #51): the decoder layers run again in the
backward (a layer's module runs during ``backward``), and the update's gradient is the one
without it, up to float rounding; full weights and LoRA adapters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.tiny_pair import batch_of, prepared
from workers.training.checkpointing import checkpointing_on
from workers.training.trainer import TorchTrainer

LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "init_seed": 0}


class Recording(TorchTrainer):
    """The torch trainer, recording each update's gradient (before the step) and how often a
    decoder layer's MLP runs inside ``backward`` (a recompute)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gradients: list[list[torch.Tensor]] = []
        self.in_backward = False
        self.backward_forwards = 0
        mlp = next(m for name, m in self.model.named_modules() if name.endswith(".mlp"))
        mlp.register_forward_pre_hook(self._count)  # a pre-hook: a recompute may stop early, inside it

    def _count(self, *_):
        self.backward_forwards += int(self.in_backward)

    def _backward(self, loss):
        self.in_backward = True
        try:
            super()._backward(loss)
        finally:
            self.in_backward = False

    def _optimizer_step(self) -> float:
        self.gradients.append([p.grad.detach().clone() for p in self.params])
        return super()._optimizer_step()


@pytest.mark.parametrize(("name", "lora"), [("gpt2-bpe", None), ("llama-char", LORA)])
def test_checkpointing_recomputes_the_layers_and_keeps_the_gradient(paths, rollouts, name, lora):
    _, groups = rollouts
    args = dict(lr=1e-3, minibatches=2, seed=0, lora=lora)
    plain = Recording(paths[name], **args)
    batch = prepared(plain.score, batch_of(groups[name]))
    plain_old = batch["old_logp"]
    plain.train(batch)
    checkpointed = Recording(paths[name], gradient_checkpointing=True, **args)
    # scoring (no gradient) under checkpointing: the same log-probs (gpt2 in training mode makes no
    # KV cache for a shared prompt prefix there)
    for got, want in zip(checkpointed.score(batch)["old_logp"], plain_old, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    checkpointed.train(batch)

    assert checkpointing_on(checkpointed.model) and not checkpointing_on(plain.model)
    assert checkpointed.model.config.use_cache is False
    assert plain.backward_forwards == 0
    assert checkpointed.backward_forwards > 0  # each grad forward of the layer again, in the backward
    assert len(checkpointed.gradients) == len(plain.gradients) == 2
    for got, want in zip(checkpointed.gradients, plain.gradients, strict=True):
        for g, w in zip(got, want, strict=True):
            # fp32 rounding (the update's forwards run each prompt itself, not a shared prefix):
            # ~1e-6 of the tensor's largest element apart
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 * float(w.abs().max()) + 1e-9)
