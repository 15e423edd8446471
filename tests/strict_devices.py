"""Trainer ranks held to NCCL's rule on a CPU-only machine: every tensor handed to a collective
lives on the trainer's (accelerator) device, never on the host.

On a CPU machine every tensor is a CPU tensor and gloo takes them all, so ``tensor.device`` cannot
tell a tensor placed on the trainer's device from one left on the host; no second real device
exists here (``meta`` holds no data; a PrivateUse1 backend needs a compiled allocator). So the
check follows where each tensor *would* be on a GPU machine, by the only rules that decide it in
torch, with a ``TorchFunctionMode`` (:class:`HostTracking`) over the rank's update:

- a tensor made by a factory (``torch.tensor``, ``zeros``, ``full``, ``from_numpy``, ...)
  without a ``device`` is on the host (torch's default device);
- ``Tensor.cpu()`` is on the host; ``.to(<a device>)`` / ``.cuda()`` / a factory given a
  ``device`` is on that device (the trainer's, in this code: the explicit placement is trusted);
- any other op's result is on the host if all its tensor inputs are (a mixed op runs on the
  device; an in-place op never moves its tensor);
- everything else (the model's weights, autograd's gradients, tensors made in C++) is on the
  trainer's device.

:func:`strict_collectives` replaces the ``torch.distributed`` collectives in the process (ours,
through ``workers.training.collectives``, and DeepSpeed's comm layer, which calls them too) with
wrappers that refuse a tensor on the host, as NCCL refuses a CPU tensor, before the real gloo
collective runs. What it cannot see: a tensor placed with an explicit ``device="cpu"`` (a
deliberate placement, kept out of the update's collectives by review) and tensors that come in
from outside the update (Ray's unpickled arguments), which are taken to be on the device.

The same mode counts the bytes that would cross from the device to the host (``.cpu()``,
``.numpy()``, ``.tolist()``, ``.item()`` of a device tensor): :attr:`HostTracking.to_host_bytes`.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

HOST = "_graftpool_on_host"
FACTORIES = {torch.tensor, torch.as_tensor, torch.asarray, torch.zeros, torch.ones, torch.empty,
             torch.full, torch.arange, torch.linspace, torch.logspace, torch.eye, torch.rand, torch.randn,
             torch.randint, torch.randperm, torch.scalar_tensor, torch.empty_strided}
TO_HOST = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__float__,
           torch.Tensor.__int__, torch.Tensor.__bool__}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
               "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "reduce", "all_to_all",
               "all_to_all_single", "all_reduce_coalesced", "gather", "scatter", "send", "recv", "isend", "irecv")


def on_host(tensor: torch.Tensor) -> bool:
    return bool(getattr(tensor, HOST, False))


def _mark(out, host: bool) -> None:
    for leaf in tree_flatten(out)[0]:
        if isinstance(leaf, torch.Tensor):
            setattr(leaf, HOST, host)


def _names_a_device(args, kwargs) -> bool:
    """Whether a ``Tensor.to`` call names a device (positionally or by keyword)."""
    if kwargs.get("device") is not None:
        return True
    return any(isinstance(a, str | torch.device | torch.Tensor) or (isinstance(a, int) and not isinstance(a, bool))
               for a in args[1:])


class HostTracking(TorchFunctionMode):
    """Marks the tensors that would be on the host on a GPU machine (module docstring)."""

    def __init__(self):
        super().__init__()
        self.to_host_bytes = 0
        self._from_numpy = torch.from_numpy

    def __enter__(self):
        real = self._from_numpy  # not routed through __torch_function__: wrapped while the mode is open

        def from_numpy(array):
            out = real(array)
            _mark(out, True)
            return out

        torch.from_numpy = from_numpy
        return super().__enter__()

    def __exit__(self, *exc):
        torch.from_numpy = self._from_numpy
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func in TO_HOST and inputs and not on_host(inputs[0]):
            self.to_host_bytes += inputs[0].numel() * inputs[0].element_size()
        out = func(*args, **kwargs)
        if func in FACTORIES:
            _mark(out, kwargs.get("device") is None)
        elif func is torch.Tensor.cpu:
            out = out.view_as(out) if out is args[0] else out  # a CPU tensor's .cpu() is itself
            _mark(out, True)
        elif func in (torch.Tensor.to, torch.Tensor.cuda) and (func is torch.Tensor.cuda
                                                               or _names_a_device(args, kwargs)):
            out = out.view_as(out) if out is args[0] else out
            target = next((a for a in args[1:] if isinstance(a, torch.Tensor)), None)
            _mark(out, on_host(target) if target is not None else False)
        elif inputs and not any(out is t for t in inputs):  # in place: the tensor stays where it is
            _mark(out, all(on_host(t) for t in inputs))
        return out


class Refused(RuntimeError):
    """A collective was handed a tensor on the host (NCCL: 'Tensors must be CUDA')."""


@contextlib.contextmanager
def strict_collectives(calls: list[str] | None = None):
    """``torch.distributed``'s collectives refuse host tensors (see the module docstring) while
    this is open; each call's name is appended to ``calls``."""
    c10d = dist.distributed_c10d  # DeepSpeed calls some collectives by this module's names
    saved = {(module, name): getattr(module, name) for module in (dist, c10d) for name in COLLECTIVES
             if hasattr(module, name)}

    def strict(name, real):
        @functools.wraps(real)
        def check(*args, **kwargs):
            for leaf in tree_flatten((args, kwargs))[0]:
                if isinstance(leaf, torch.Tensor) and on_host(leaf):
                    raise Refused(f"torch.distributed.{name}: a host tensor {tuple(leaf.shape)} {leaf.dtype} "
                                  f"was handed to a collective of a group on the trainer's device")
            if calls is not None:
                calls.append(name)
            return real(*args, **kwargs)

        return check

    for (module, name), real in saved.items():
        setattr(module, name, strict(name, real))
    try:
        yield
    finally:
        for (module, name), real in saved.items():
            setattr(module, name, real)


def strict_trainer(base: type) -> type:
    """A subclass of the trainer backend ``base`` (one per Ray actor process) whose ``train``
    (the update, with its collectives) runs under :class:`HostTracking`, with
    :func:`strict_collectives` open from its construction on; ``calls()`` returns the names of
    the collectives it has made."""

    class Strict(base):
        def __init__(self, *args, **kwargs):
            self.collective_calls: list[str] = []
            # for the actor's life, before a process group or an engine exists: DeepSpeed's comm
            # layer looks some collectives up once, when it starts (only tracked tensors are refused)
            self._strict = strict_collectives(self.collective_calls)
            self._strict.__enter__()
            super().__init__(*args, **kwargs)

        def train(self, *args, **kwargs):
            with HostTracking():
                return super().train(*args, **kwargs)

        def calls(self) -> list[str]:
            return list(self.collective_calls)

        def host_bytes(self, method: str, *args) -> int:
            """Bytes ``method(*args)`` copies from the device to the host (:class:`HostTracking`)."""
            with HostTracking() as mode:
                getattr(self, method)(*args)
            return mode.to_host_bytes

    Strict.__name__ = Strict.__qualname__ = f"Strict{base.__name__}"
    return Strict
