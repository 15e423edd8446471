"""Trainer ranks' collectives on the device of their process group (issue #51): NCCL takes CUDA
tensors only, so every tensor the update hands to a collective must be on the trainer's device,
never a host tensor; gloo on the CPU takes both, so two real ranks run here under a strict wrapper
that refuses what NCCL would (``tests/strict_devices.py`` explains how it tells a host tensor from
a device tensor on a CPU-only machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

from tests.strict_devices import HostTracking, Refused, on_host, strict_collectives, strict_trainer
from tests.tiny_pair import mixed_batch
from workers.training.collectives import all_reduce, all_reduce_to_host, collective_device
from workers.training.trainer import TorchTrainer

ARGS = dict(lr=1e-3, minibatches=2, seed=0)


def test_the_strict_wrapper_refuses_a_host_tensor_and_passes_a_device_one():
    """The check is real: a tensor made without a device, or moved with ``.cpu()``, is refused
    before any process group is touched; one made on the device, or a gradient, passes to the
    collective itself (which then finds no group)."""
    layer = torch.nn.Linear(3, 2)
    with HostTracking(), strict_collectives():
        layer(torch.zeros(3, device="cpu")).sum().backward()
        for tensor in (torch.tensor([1.0]), layer.weight.grad.reshape(-1).cpu(), torch.zeros(2) + 1):
            assert on_host(tensor)
            with pytest.raises(Refused):
                dist.all_reduce(tensor)
        for tensor in (layer.weight.grad, torch.tensor([1.0]).to(device=torch.device("cpu"), copy=True)):
            assert not on_host(tensor)
            with pytest.raises(ValueError, match="process group"):  # past the check: no group here
                dist.all_reduce(tensor)


def test_collectives_name_the_group_device_and_refuse_another():
    assert collective_device("nccl", torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert collective_device("gloo", torch.device("cpu")) == torch.device("cpu")
    with pytest.raises(RuntimeError, match="all_reduce on meta: a tensor on cpu"):
        all_reduce(torch.zeros(1), torch.device("meta"))


def test_a_group_device_named_without_its_index_takes_the_tensors_on_it():
    """Issue #51's eighth read: a trainer rank on a GPU names its device ``torch.device("cuda")``
    (``trainer.num_gpus`` > 0), its tensors report ``cuda:0``, and torch compares the two unequal,
    so the device check refused every tensor of the update's collectives: with two ranks a model
    on GPUs (the GPU template's ZeRO-3 pair) the first update failed at its first micro-batch's
    finite-loss flag. A CPU holds the mirror case through a real one-rank gloo group: a group's
    device named with its index (``cpu:0``) and tensors that report it without (``cpu``)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        flag = all_reduce_to_host(torch.tensor([1.0]), torch.device("cpu", 0), "min")  # update_loop's flag
        assert flag.tolist() == [1.0]
        grad = torch.ones(3)
        assert all_reduce(grad, torch.device("cpu", 0)) is grad
    finally:
        dist.destroy_process_group()
    from workers.training.collectives import same_device

    assert torch.device("cuda", 0) != torch.device("cuda")  # why the check compared by hand
    assert same_device(torch.device("cuda", 0), torch.device("cuda"))
    assert not same_device(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not same_device(torch.device("cpu"), torch.device("cuda"))


def test_two_ranks_hand_only_device_tensors_to_their_collectives(paths, rollouts, ray_local):
    """Two real ranks (Ray actors, gloo) run a step of own, grafted and SGT rows with mixed
    minibatches (the own part of the gradient read between own and peer rows) under the strict
    wrapper: no host tensor reaches a collective, and the update equals one rank's."""
    ray = ray_local
    single = TorchTrainer(paths["gpt2-bpe"], **ARGS)
    batch = mixed_batch(paths, rollouts, single, **ARGS)
    expected = single.train(batch)
    assert "mixed" in [u.kind for u in expected.minibatches]

    from orchestrator.cluster.model_actors import join_process_group

    cls = ray.remote(strict_trainer(TorchTrainer))
    ranks = [cls.options(num_cpus=0.5).remote(str(paths["gpt2-bpe"]), rank=r, world_size=2, **ARGS)
             for r in range(2)]
    join_process_group(ranks)
    results = ray.get([t.train.remote(batch) for t in ranks])
    calls = ray.get(ranks[0].calls.remote())
    assert calls.count("all_reduce") > len(list(single.model.parameters()))  # gradients, own parts, counts
    result = results[0]
    assert [u.kind for u in result.minibatches] == [u.kind for u in expected.minibatches]
    assert result.metrics["train/loss"] == pytest.approx(expected.metrics["train/loss"], abs=1e-5)
    for got, want in zip(result.minibatches, expected.minibatches, strict=True):
        np.testing.assert_allclose([got.grad_norm, got.own_grad_norm, got.peer_grad_norm],
                                   [want.grad_norm, want.own_grad_norm, want.peer_grad_norm], rtol=1e-3)
    np.testing.assert_allclose(result.outcomes["weight"], expected.outcomes["weight"], rtol=1e-5)
    for actor in ranks:
        ray.kill(actor)
