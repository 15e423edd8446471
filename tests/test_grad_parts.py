"""The own / peer parts of a mixed update's gradient (``train/peer_grad_share``, issue #51): read
on the trainer's device from per-parameter norms, not by copying the gradient to the host;
``grad_parts: false`` turns them off."""

from __future__ import annotations

import math

import pytest
import torch

from tests.strict_devices import HostTracking
from tests.tiny_pair import made_mixed, mixed_batch
from workers.training.trainer import TorchTrainer

ARGS = dict(lr=1e-3, minibatches=1, seed=0)  # one update of all the rows: own and peer parts both non-zero


class Recording(TorchTrainer):
    """The torch trainer, recording what the split reads: the host computation the split had
    before (the own and the total gradient as flat fp32 host vectors, |own| and |total - own|),
    the bytes each ``_step_with_parts`` copies to the host besides the optimizer step's
    (``HostTracking``: device-to-host reads on a GPU machine), and how often the own part is snapshot."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.host_parts: list[tuple[float, float]] = []
        self.step_host_bytes: list[int] = []
        self.snapshots = 0
        self._own: torch.Tensor | None = None
        self._tracking: HostTracking | None = None

    def _flat(self) -> torch.Tensor:
        return torch.cat([p.grad.detach().reshape(-1).float() for p in self.params if p.grad is not None]).cpu()

    def _grad_snapshot(self):
        self.snapshots += 1
        self._own = self._flat()
        return super()._grad_snapshot()

    def _optimizer_step(self) -> float:
        if self._own is not None:
            counted = self._tracking.to_host_bytes
            total = self._flat()
            self.host_parts.append((float(self._own.norm()), float((total - self._own).norm())))
            self._tracking.to_host_bytes = counted  # the reference's own reads are not the trainer's
            self._own = None
        counted = self._tracking.to_host_bytes
        norm = super()._optimizer_step()
        self._tracking.to_host_bytes = counted  # clipping and AdamW's own reads (its step counts), not the split's
        return norm

    def _step_with_parts(self, *args):
        with HostTracking() as tracking:
            self._tracking = tracking
            out = super()._step_with_parts(*args)
        self.step_host_bytes.append(tracking.to_host_bytes)
        return out


def test_the_parts_are_the_host_computations_and_two_floats_come_back(paths, rollouts):
    # the receiver's own groups made mixed (a uniform one's first reward flipped): with the sampled
    # rewards alone they can all be uniform (advantage 0, an own part of 0) on some CPUs, as on a
    # Xeon without AVX512-BF16 or AMX
    problems, groups = rollouts
    rollouts = problems, {**groups, "gpt2-bpe": [made_mixed(g) for g in groups["gpt2-bpe"]]}
    trainer = Recording(paths["gpt2-bpe"], **ARGS)
    result = trainer.train(mixed_batch(paths, rollouts, trainer, **ARGS))
    mixed = [u for u in result.minibatches if u.kind == "mixed"]
    assert mixed and len(trainer.host_parts) == len(mixed)
    for update, (own, peer) in zip(mixed, trainer.host_parts, strict=True):
        # fp32 sums of squares over ~1e5 elements in another order: ~1e-5 apart
        assert (update.own_grad_norm, update.peer_grad_norm) == pytest.approx((own, peer), rel=1e-4)
        assert own > 0 and peer > 0
    gradient_bytes = sum(p.numel() * 4 for p in trainer.params)
    # per update, besides the optimizer step's own reads: the two parts (two floats), never the gradient
    assert max(trainer.step_host_bytes) <= 16 < gradient_bytes / 100
    assert 0 < result.metrics["train/peer_grad_share"] < 1


def test_grad_parts_off_reads_no_split(paths, rollouts):
    trainer = Recording(paths["gpt2-bpe"], grad_parts=False, **ARGS)
    result = trainer.train(mixed_batch(paths, rollouts, trainer, **ARGS))
    assert "mixed" in [u.kind for u in result.minibatches]
    assert trainer.snapshots == 0 and trainer.host_parts == []
    assert all(math.isnan(u.own_grad_norm) and math.isnan(u.peer_grad_norm) for u in result.minibatches)
    assert math.isnan(result.metrics["train/peer_grad_share"])
    assert all(math.isfinite(u.grad_norm) for u in result.minibatches)
