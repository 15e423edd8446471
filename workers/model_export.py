"""A trainer's final model written as a transformers folder in its export dtype
(``models[].trainer.export_dtype``, resolved by ``workers.precision.resolve_export_dtype``).

The floating-point weights are cast to the export dtype, nothing else: bf16 stores 2 bytes a
parameter where fp32 stores 4, so a bf16-mixed run's export is half the bytes (6 GB instead of
12 GB for a 3 B model) and carries what its bf16 forward computed with. Tensors that share
storage (tied embeddings) stay one tensor, so they are written once as before. Integer buffers
are written as they are. ``config.json``'s ``dtype`` says what the files hold. Where every
weight is already in the export dtype, ``save_pretrained`` runs exactly as it always did (the
same bytes). Checkpoints (``save``) are not exports: they keep the weights as kept.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch


def _per_storage(weights: Mapping[str, torch.Tensor], convert) -> dict[str, torch.Tensor]:
    """``convert`` applied once per storage: entries that share storage (a tied LM head and its
    embedding) are one tensor after as before."""
    done: dict[tuple[int, torch.Size, tuple[int, ...], torch.device], torch.Tensor] = {}
    out = {}
    for name, value in weights.items():
        key = (value.data_ptr(), value.shape, value.stride(), value.device)
        if value.numel() == 0 or key not in done:
            done[key] = convert(value.detach())
        out[name] = done[key]
    return out


def cast_weights(weights: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``weights`` with every floating tensor in ``dtype`` (on the CPU, no copy where it is there
    in that dtype already); tensors that share storage before stay one tensor after."""
    return _per_storage(weights, lambda v: v.to(device="cpu", dtype=dtype) if v.is_floating_point() else v.cpu())


def host_copies(weights: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of ``weights`` copied to the host, a floating one cast to ``dtype`` on its
    device first (None: as it is), one copy per storage, so a weight sync sends a tied LM head
    once and ``save_pretrained`` writes it once."""
    def copy(value: torch.Tensor) -> torch.Tensor:
        host = (value.to(dtype) if dtype is not None and value.is_floating_point() else value).cpu()
        return host.clone() if host.data_ptr() == value.data_ptr() else host  # a host tensor in its dtype

    return _per_storage(weights, copy)


def save_model(model: torch.nn.Module, folder: str | Path, dtype: torch.dtype,
               weights: Mapping[str, torch.Tensor] | None = None) -> None:
    """``model.save_pretrained(folder)`` of ``weights`` (None: the model's own state dict) with
    the floating tensors in ``dtype`` and ``config.json``'s ``dtype`` naming it."""
    state = model.state_dict() if weights is None else weights
    if all(not v.is_floating_point() or v.dtype == dtype for v in state.values()):
        model.save_pretrained(str(folder), state_dict=None if weights is None else dict(weights))  # type: ignore[operator]
    else:
        model.save_pretrained(str(folder), state_dict=cast_weights(state, dtype))  # type: ignore[operator]
    name = str(dtype).removeprefix("torch.")
    path = Path(folder) / "config.json"
    config = json.loads(path.read_text())
    keys = [key for key in ("dtype", "torch_dtype") if key in config] or ["dtype"]
    if any(config.get(key) != name for key in keys):  # as transformers writes it (to_json_string)
        path.write_text(json.dumps({**config, **dict.fromkeys(keys, name)}, indent=2, sort_keys=True) + "\n")
