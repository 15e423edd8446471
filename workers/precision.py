"""Numeric precision of a model's trainer (``models[].trainer.precision``) and of its ``hf``
generation replicas (``models[].generation.dtype``).

A trainer precision is two dtypes, nothing else:

- ``weights``: what the parameters are kept in, hence their gradients and AdamW's state;
- ``compute``: the dtype of ``torch.autocast`` around the forward passes (None: no autocast).

| name | weights | compute | what it is |
|---|---|---|---|
| ``fp32`` | float32 | - | everything in fp32 |
| ``bf16-mixed`` | float32 | bfloat16 | autocast: matmuls in bf16, fp32 master weights, gradients and AdamW state |
| ``bf16`` | bfloat16 | - | bf16 weights (and gradients, AdamW state): half the memory, updates below bf16's resolution are lost |

``auto`` resolves where the device is known (the actor's): ``bf16-mixed`` on a GPU, ``fp32`` on a
CPU. What stays fp32 whatever the precision: log-probs (the logits are cast to fp32 before
``log_softmax`` / ``logsumexp``, ``workers.training.logprobs._chunk_logp`` and
``workers.training.batching.token_logprobs``), so the gate's s and the objective's ratios and its reduction
are fp32 too; checkpoints hold the weights as kept (``bf16-mixed``: the fp32 masters), so a
resume is exact. The weights sent to ``hf`` replicas are cast to the replicas' dtype
(:func:`generation_dtype`), which they also load their model in; ``vllm`` replicas are sent
the trainer's compute dtype (:func:`resolve_sync_dtype`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from workers.registries import (
    PRECISIONS,  # declared without torch: the config checks names against it
)


@dataclass(frozen=True)
class Precision:
    name: str
    weights: torch.dtype
    compute: torch.dtype | None = None

    def cast(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model with its parameters and buffers in ``weights`` (before the optimizer is made)."""
        return model.to(self.weights)

    def autocast(self, device: torch.device | str):
        """The context forward passes run in: ``torch.autocast`` to ``compute``, or nothing."""
        if self.compute is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(device).type, dtype=self.compute)


for _precision in (Precision("fp32", torch.float32), Precision("bf16-mixed", torch.float32, torch.bfloat16),
                   Precision("bf16", torch.bfloat16)):
    PRECISIONS.register(_precision.name)(_precision)

GENERATION_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
"""``models[].generation.dtype`` values (``hf`` backend) and their torch dtypes."""


SYNC_DTYPES = {**GENERATION_DTYPES, "float16": torch.float16}
"""What a weight sync may send: a generation dtype, or a vLLM engine's float16."""


def on_gpu(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def resolve_precision(name: str, device: torch.device | str) -> str:
    """``auto`` -> ``bf16-mixed`` on a GPU, ``fp32`` on a CPU; any other name as given."""
    if name == "auto":
        return "bf16-mixed" if on_gpu(device) else "fp32"
    return name


def precision_for(name: str, device: torch.device | str) -> Precision:
    """The :class:`Precision` a trainer on ``device`` runs with (``auto`` resolved)."""
    return PRECISIONS.get(resolve_precision(name, device))


def resolve_generation_dtype(name: str, device: torch.device | str) -> str:
    """``auto`` -> ``bfloat16`` on a GPU, ``float32`` on a CPU; any other name as given."""
    if name == "auto":
        return "bfloat16" if on_gpu(device) else "float32"
    if name not in GENERATION_DTYPES:
        raise ValueError(f"models[].generation.dtype: expected auto or one of {sorted(GENERATION_DTYPES)}, "
                         f"got {name!r}")
    return name


def generation_dtype(name: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype of ``hf`` replicas on ``device`` (``auto`` resolved)."""
    return GENERATION_DTYPES[resolve_generation_dtype(name, device)]


def resolve_export_dtype(name: str, compute: torch.dtype) -> torch.dtype:
    """The dtype a trainer's export (its final model) is written in (``models[].trainer.export_dtype``):
    ``auto`` -> ``compute``, the dtype the trainer computes in (``bf16-mixed`` and ``bf16``:
    bfloat16, ``fp32``: float32; deepspeed: its engine's ``bf16``); ``float32`` | ``bfloat16`` as
    named. Checkpoints keep the weights as kept whatever this is (``workers.model_export``)."""
    if name == "auto":
        return compute
    if name not in GENERATION_DTYPES:
        raise ValueError(f"models[].trainer.export_dtype: expected auto or one of {sorted(GENERATION_DTYPES)}, "
                         f"got {name!r}")
    return GENERATION_DTYPES[name]


def resolve_sync_dtype(configured: str, trainer_precision: str, trainer_device: torch.device | str,
                       vllm_dtype: str = "auto", trainer_bf16: bool | None = None) -> str:
    """The dtype a trainer sends a ``vllm`` replica its weights in (``models[].generation.sync_dtype``):
    ``configured`` when not ``auto``; else the trainer's compute dtype when it is bf16 (precision
    ``bf16`` or ``bf16-mixed`` after ``auto`` is resolved on ``trainer_device``; the deepspeed
    backend: ``trainer_bf16``, its engine's bf16 switch, None being bf16 on a GPU), so the sync
    carries no more bits than the update computed with (2 bytes a parameter, half of fp32);
    else the engine's ``vllm_dtype`` when set; else float32. The engine casts what it receives
    to its own dtype (vLLM's weight loaders copy into its parameters), so any of them loads."""
    if configured != "auto":
        if configured not in SYNC_DTYPES:
            raise ValueError(f"models[].generation.sync_dtype: expected auto or one of {sorted(SYNC_DTYPES)}, "
                             f"got {configured!r}")
        return configured
    if trainer_bf16 is None:
        trainer_bf16 = resolve_precision(trainer_precision, trainer_device) in ("bf16", "bf16-mixed")
    if trainer_bf16:
        return "bfloat16"
    return vllm_dtype if vllm_dtype in SYNC_DTYPES else "float32"


def deepspeed_bf16(precision: str, bf16: bool | None) -> bool | None:
    """The DeepSpeed engine's ``bf16`` switch for a trainer precision (None: the engine's own
    default, bf16 on a GPU): ``bf16-mixed`` is DeepSpeed's bf16 (bf16 forward and backward, fp32
    master weights and optimizer state in the engine), ``fp32`` is bf16 off, ``auto`` leaves
    ``trainer.deepspeed.bf16`` as set; pure ``bf16`` weights DeepSpeed does not train, and a
    precision that contradicts an explicit ``deepspeed.bf16`` is refused."""
    if precision == "bf16":
        raise ValueError("models[].trainer.precision: the deepspeed backend keeps fp32 master weights; "
                         "use bf16-mixed (DeepSpeed's bf16) or fp32")
    wanted = {"bf16-mixed": True, "fp32": False}.get(precision)
    if wanted is None:
        return bf16
    if bf16 is not None and bf16 != wanted:
        raise ValueError(f"models[].trainer.precision {precision} contradicts trainer.deepspeed.bf16: {bf16}; "
                         "set one of them")
    return wanted
