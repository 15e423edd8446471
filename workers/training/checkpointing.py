"""Gradient checkpointing of a trainer's transformers model (``models[].trainer.gradient_checkpointing``).

Each decoder layer keeps only its inputs in the forward and runs again in the backward to get its
activations back (``torch.utils.checkpoint``, ``use_reentrant=False``): the update's activation
memory goes from every layer's to one layer's at a time, for about one more forward per update.
The gradients are the same, up to float rounding.

What it changes besides: the KV cache is off in training forwards (``config.use_cache``; a
checkpointed layer that wrote a cache would write it again when replayed; some models, gpt2,
make none in training mode even without gradients), so every forward runs each row's prompt
itself (``share_prompts`` is not used, ``workers.training.trainer.TorchTrainer._logprobs``); with LoRA, the embeddings' output
requires grad (peft's ``enable_input_require_grads``) so that a checkpointed segment whose
weights are all frozen still passes the gradient through.
"""

from __future__ import annotations

import torch


def enable_gradient_checkpointing(model: torch.nn.Module, lora: bool) -> None:
    """Turn checkpointing on in ``model`` (a transformers model, adapters injected or not)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"models[].trainer.gradient_checkpointing: {type(model).__name__} does not support "
                         "gradient checkpointing; set it to false")
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the older name is deprecated
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False
    if lora:
        model.enable_input_require_grads()


def checkpointing_on(model: torch.nn.Module) -> bool:
    """Whether ``model`` (a transformers model) has checkpointing on."""
    if hasattr(model, "is_activation_checkpointing"):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)
