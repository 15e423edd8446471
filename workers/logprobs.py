"""Memory-safe log-probs of given tokens, and token-budget micro-batches.

:func:`workers.batching.token_logprobs` runs the whole causal LM, whose head materialises
logits [B, T, V], then takes ``log_softmax`` of them in fp32: at 256 rows x 4096 tokens x
152k vocab that is ~640 GB for the fp32 copy alone. :func:`sampled_logprobs` gives the same
[B, T-1] result while only ever holding logits for ``chunk_tokens`` response tokens at a
time, in the forward and in the backward pass. :func:`pack_by_tokens` splits a batch into
micro-batches of bounded padded size (rows x longest row), like verl's dynamic batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from workers.batching import token_logprobs

CHUNKABLE_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
    "gpt2", "gpt_neox", "olmo2", "starcoder2", "deepseek_v3", "gemma",
})  # fmt: skip
"""``config.model_type`` values whose ``*ForCausalLM.forward`` computes exactly
``logits = lm_head(base_model(...).last_hidden_state)`` (checked against transformers 5.24
sources). Other types take the full path: many rescale or cap their logits after the head
(gemma2/3 ``final_logit_softcapping``, cohere ``logit_scale``, granite ``logits_scaling``,
bart-like ``final_logits_bias``, ...), which the chunked path would silently get wrong. Add a
type here only after reading its causal-LM forward."""

LOGIT_TRANSFORM_ATTRS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields that, when set, mean the logits are not just ``lm_head(hidden)``."""


def _hf_model(model):
    """The transformers model inside ``model`` (a DeepSpeed engine keeps it as ``.module``)."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return None  # DDP's gradient sync needs its own forward: keep the full path
    inner = getattr(model, "module", None)
    return inner if isinstance(inner, PreTrainedModel) else None


def chunkable(model) -> bool:
    """Whether :func:`sampled_logprobs` can run ``model`` as backbone + chunked output head."""
    hf = _hf_model(model)
    if hf is None or hf.get_output_embeddings() is None or hf.base_model is hf:
        return False
    try:  # FSDP2 unshards root-level weights (embeddings, head) in the root forward only
        from torch.distributed.fsdp import FSDPModule

        if isinstance(hf, FSDPModule):
            return False
    except ImportError:  # pragma: no cover - torch without distributed
        pass
    if hf.config.model_type not in CHUNKABLE_MODEL_TYPES:
        return False
    configs = (hf.config, hf.config.get_text_config())
    return all(getattr(c, a, None) is None for c in configs for a in LOGIT_TRANSFORM_ATTRS)


def _chunk_logp(head: nn.Module, hidden: Tensor, target: Tensor) -> Tensor:
    """log p(target) = z_target - logsumexp(z), z = head(hidden) upcast to fp32; [n]."""
    logits = head(hidden).float()
    return logits.gather(-1, target[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def sampled_logprobs(model, batch: dict[str, Tensor], chunk_tokens: int | None = 4096) -> Tensor:
    """log pi(x_{t+1} | x_<=t) of the batch's own tokens, [B, T-1], zero where masked out.

    Same contract and values as :func:`workers.batching.token_logprobs` (``batch`` from
    :func:`workers.batching.pad_rows`, already on the model's device; the result is fp32
    and carries the gradient to the model's parameters), computed as:

    1. ``h = model.base_model(input_ids, attention_mask, use_cache=False).last_hidden_state``
       [B, T, H]: the backbone only (its final norm included), whose last hidden state is
       what the causal-LM head is applied to;
    2. the N rows of ``h[:, :-1]`` where ``response_mask != 0``, flattened to [N, H], with
       their targets ``input_ids[:, 1:]`` at the same places (prompt and padding cost
       nothing past the backbone);
    3. for each chunk of at most ``chunk_tokens`` of those rows, z = head(h_chunk) upcast
       to fp32 ([chunk, V], the head run in the model's dtype as in the full path) and

           log p(y) = z_y - logsumexp(z)

       Under grad each chunk runs inside a non-reentrant ``torch.utils.checkpoint``: the
       backward recomputes that chunk's logits instead of keeping all N x V alive, so peak
       extra memory is O(chunk_tokens * V), independent of B * T (with ~2x the head FLOPs);
    4. the N values scattered into a [B, T-1] fp32 zero tensor, then multiplied by
       ``response_mask`` (as the full path does, so a non-binary mask scales alike).

    ``head`` is ``model.get_output_embeddings()``, tied to the input embeddings or not
    (a tied weight gets both gradients, as in the full forward). Falls back to
    ``token_logprobs`` (the full [B, T, V] path) when ``chunk_tokens`` is None or when
    :func:`chunkable` is False: a model type whose logits are not just ``head(hidden)``
    (see :data:`CHUNKABLE_MODEL_TYPES`, :data:`LOGIT_TRANSFORM_ATTRS`), no output
    embeddings, a DDP or FSDP2 wrapper. A DeepSpeed engine is unwrapped to its ``.module``.
    Positions are the backbone's defaults (0..T-1), right for right-padded rows.
    """
    if chunk_tokens is None or not chunkable(model):
        return token_logprobs(model, batch)
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1 or None, got {chunk_tokens}")
    hf = _hf_model(model)
    mask = batch["response_mask"]
    hidden = hf.base_model(  # no KV cache: nothing is generated after this pass
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).last_hidden_state
    where = mask != 0  # [B, T-1]
    states = hidden[:, :-1][where]  # [N, H]
    targets = batch["input_ids"][:, 1:][where]  # [N]
    head = hf.get_output_embeddings()
    use_checkpoint = torch.is_grad_enabled()
    pieces = []
    # At least one (maybe empty) chunk, so that the result is always in the head's graph.
    for start in range(0, max(states.shape[0], 1), chunk_tokens):
        h, y = states[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if use_checkpoint:
            pieces.append(checkpoint(_chunk_logp, head, h, y, use_reentrant=False))
        else:
            pieces.append(_chunk_logp(head, h, y))
    values = torch.cat(pieces)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=values.device)
    out = out.index_put(tuple(where.nonzero(as_tuple=True)), values)
    return out * mask


def pack_by_tokens(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Row indices split into micro-batches of padded size <= ``max_tokens``.

    ``lengths[i]`` is row i's full sequence length (prompt + response). A micro-batch's
    padded size is ``len(rows) * max(lengths of its rows)``, what :func:`pad_rows` allocates.
    Rule: order the rows by length, longest first (a stable sort, so equal lengths keep
    index order), then fill micro-batches greedily in that order, starting a new one when
    the next row would push the padded size past ``max_tokens``. A row longer than
    ``max_tokens`` therefore sits alone. Since each micro-batch holds rows of adjacent
    lengths, padding stays small, and greedy filling of the sorted order gives the fewest
    micro-batches among splits into runs of that order.

    Returns the micro-batches longest first (an out-of-memory shows at the first one),
    each as ascending row indices; every index appears exactly once; deterministic.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must be >= 0")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # The first row of a micro-batch is its longest, since rows come longest first.
        if current and (len(current) + 1) * lengths[current[0]] > max_tokens:
            batches.append(sorted(current))
            current = []
        current.append(i)
    if current:
        batches.append(sorted(current))
    return batches
