"""One prefill of left-padded prompts, whose KV cache several continuations then share.

Used twice: generation copies each prompt's cache to its n samples
(``workers.rollout.generation.shared_prompt_cache``), and the trainer re-indexes it to the rows of
a micro-batch that share a prompt (``workers.training.logprobs.row_logprobs``).
"""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _cache_name(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(module) -> str:
    """The name a transformers forward (and ``generate``) takes its KV cache under: ``cache``
    from transformers 5.20 on, ``past_key_values`` before."""
    return _cache_name(type(module))


def left_pad_positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows, as ``generate`` gives them: mask cumsum - 1, and 1
    on padding."""
    positions = mask.long().cumsum(-1) - 1
    return positions.masked_fill_(mask == 0, 1)


def prefill(module, input_ids: torch.Tensor, attention_mask: torch.Tensor, cache=None):
    """Run ``module`` (a causal LM or its backbone) on all but the last column of left-padded
    prompts (left padding keeps every prompt's last token there; the continuation starts
    from it) and return its KV cache (with its autograd graph when grad is on): ``cache``
    filled, when one is given, else the one transformers makes."""
    positions = left_pad_positions(attention_mask)
    given = {} if cache is None else {cache_argument(module): cache}
    out = module(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                 position_ids=positions[:, :-1], use_cache=True, **given)
    return out.cache if cache_argument(module) == "cache" else out.past_key_values


def select_rows(cache, index: torch.Tensor) -> None:
    """Re-index every layer of a prefilled ``cache`` to the rows ``index`` names, in place:
    ``keys <- keys.index_select(0, index)`` (and values), the cache's autograd graph kept.

    The forward equals transformers' ``cache.batch_select_indices(index)`` (``keys[index]``);
    the backward is an ``index_add_`` instead of advanced indexing's accumulating ``index_put_``:
    at the step benchmark's shape 1.5 vs 13.6 ms in fp32 (bitwise the same gradients for rows
    grouped by prompt) and 1.0 vs 21.9 ms in bf16 (nearer the fp32 sum; figures in
    benchmarks/results/measured.md). A layer whose class overrides ``batch_select_indices``
    (it keeps more than keys and values), or a cache without ``layers`` (transformers before
    4.56), is re-indexed by its own method."""
    layers = getattr(cache, "layers", None)
    if layers is None:
        cache.batch_select_indices(index)
        return
    from transformers.cache_utils import DynamicLayer  # loaded with the model by then

    for layer in layers:
        if type(layer).batch_select_indices is DynamicLayer.batch_select_indices:
            layer.keys = layer.keys.index_select(0, index)
            layer.values = layer.values.index_select(0, index)
        else:
            layer.batch_select_indices(index)
