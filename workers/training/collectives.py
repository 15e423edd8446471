"""The collectives of a model's trainer ranks, each on the device its process group is declared for.

NCCL (trainer ranks on GPUs) takes CUDA tensors only; gloo (on the CPU) takes CPU tensors. A
trainer has one collective device, :func:`collective_device` (its own device under ``nccl``, the
CPU under ``gloo``), and every tensor it hands to a collective lives there: host bookkeeping
(counts, losses, the peer rows' s and weight) is copied there just before the collective and read
back to the host just after it (:func:`all_reduce_to_host`); gradients are reduced where they are
(:func:`all_reduce`). Every ``torch.distributed`` call of the update goes through this module,
which refuses a tensor on another device with an error naming both devices (NCCL's own error is
a crash at the first update).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def collective_device(backend: str, device: torch.device) -> torch.device:
    """The device of a process group's tensors: the trainer's ``device`` under ``nccl``, the CPU
    under ``gloo``."""
    if backend == "nccl":
        return device
    if backend == "gloo":
        return torch.device("cpu")
    raise ValueError(f"trainer process group: expected backend nccl or gloo, got {backend!r}")


def same_device(tensor_device: torch.device, device: torch.device) -> bool:
    """Whether a tensor on ``tensor_device`` is on ``device``: the same type, and the same index
    where both name one. A device named without an index is its type's current device, the one
    its tensors report with their index: a trainer's ``torch.device("cuda")`` holds tensors on
    ``cuda:0`` (a Ray actor given one GPU sees it as device 0), and ``torch.device("cuda") ==
    torch.device("cuda", 0)`` is False in torch."""
    return tensor_device.type == device.type and (
        tensor_device.index is None or device.index is None or tensor_device.index == device.index)


def all_reduce(tensor: torch.Tensor, device: torch.device, op: str = "sum") -> torch.Tensor:
    """``tensor`` reduced over the trainer ranks in place (``op``: sum, min, max); it must be on
    ``device``, the group's (:func:`collective_device`, :func:`same_device`). Returns ``tensor``."""
    if not same_device(tensor.device, device):
        raise RuntimeError(f"collective all_reduce on {device}: a tensor on {tensor.device} was handed to it "
                           f"(the process group's tensors live on its device)")
    dist.all_reduce(tensor, op=OPS[op])
    return tensor


def all_reduce_to_host(values: torch.Tensor, device: torch.device, op: str = "sum") -> torch.Tensor:
    """Host ``values`` reduced over the ranks: copied to ``device`` (no copy when it is the CPU),
    reduced there, read back; returns a CPU tensor (``values`` itself is not written)."""
    on_device = values.to(device=device, copy=True)
    return all_reduce(on_device, device, op).cpu()
