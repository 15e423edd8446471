"""The torch RNG states a trainer checkpoint keeps: the host's always, and the CUDA device's where
the trainer runs on one, so that dropout (a LoRA adapter's, a model's own) draws the same masks
after a resume as in the run it continues. A checkpoint written before the device's state was kept
restores the host's alone."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def torch_rng_states(device: torch.device) -> dict[str, torch.Tensor]:
    """``{"torch_rng": host state}``, and ``"cuda_rng"``: ``device``'s state when it is a CUDA device."""
    states = {"torch_rng": torch.get_rng_state()}
    if device.type == "cuda":
        states["cuda_rng"] = torch.cuda.get_rng_state(device)
    return states


def restore_torch_rng(states: Mapping[str, torch.Tensor], device: torch.device) -> None:
    """Set what :func:`torch_rng_states` kept (the device's state only on that kind of device)."""
    torch.set_rng_state(states["torch_rng"])
    if device.type == "cuda" and "cuda_rng" in states:
        torch.cuda.set_rng_state(states["cuda_rng"], device)
