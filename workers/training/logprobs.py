"""Memory-safe log-probs of given tokens, and token-budget micro-batches.

:func:`workers.training.batching.token_logprobs` runs the whole causal LM, whose head materialises
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

from graftpool.step_record import StepRecord
from workers.rollout.prefix import cache_argument, prefill, select_rows
from workers.training.batching import pad_rows, to_device, token_logprobs
from workers.training.head_logprobs import fused_head_applies, head_logprobs

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
    """The transformers model whose backbone and head may be called directly: ``model``
    itself, or the ``.module`` of a DeepSpeed ZeRO-1/2 engine. None for a ZeRO-3 engine: it
    gathers its partitioned weights in hooks that its own forward drives, and calling the
    backbone and head directly (with grad_accum 2) left the torch backend's losses by 4% within
    one step (tests/test_scale_backends.py, measured), so ZeRO-3 keeps the full path."""
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        return model
    inner = getattr(model, "module", None)
    stage = getattr(model, "zero_optimization_stage", None)
    if not isinstance(inner, PreTrainedModel) or (callable(stage) and stage() >= 3):
        return None
    return inner


def chunkable(model) -> bool:
    """Whether :func:`sampled_logprobs` can run ``model`` as backbone + chunked output head."""
    hf = _hf_model(model)
    if hf is None or hf.get_output_embeddings() is None or hf.base_model is hf:
        return False
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

    Same contract and values as :func:`workers.training.batching.token_logprobs` (``batch`` from
    :func:`workers.training.batching.pad_rows`, already on the model's device; the result is fp32
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
    embeddings, a DeepSpeed ZeRO-3 engine (:func:`_hf_model`). A ZeRO-1/2 engine is
    unwrapped to its ``.module``.
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
    return _head_logprobs(hf, states, targets, where, chunk_tokens) * mask


def _head_logprobs(hf, states: Tensor, targets: Tensor, where: Tensor, chunk_tokens: int) -> Tensor:
    """log p(targets) from the [N, H] ``states`` through the output head in checkpointed chunks
    (see :func:`sampled_logprobs`, steps 3-4), scattered into a zero tensor shaped ``where``. Under
    grad, a plain ``nn.Linear`` head takes :func:`workers.training.head_logprobs.head_logprobs`
    instead: the same values, whose backward holds one chunk's logits at a time, not four to five."""
    head = hf.get_output_embeddings()
    if torch.is_grad_enabled() and fused_head_applies(head):
        values = head_logprobs(head, states, targets, chunk_tokens)
    else:
        values = _checkpointed_chunks(head, states, targets, chunk_tokens)
    out = torch.zeros(where.shape, dtype=torch.float32, device=values.device)
    return out.index_put(tuple(where.nonzero(as_tuple=True)), values)


def _checkpointed_chunks(head: nn.Module, states: Tensor, targets: Tensor, chunk_tokens: int) -> Tensor:
    """log p(targets) [N], each chunk's :func:`_chunk_logp` checkpointed under grad."""
    use_checkpoint = torch.is_grad_enabled()
    pieces = []
    # At least one (maybe empty) chunk, so that the result is always in the head's graph.
    for start in range(0, max(states.shape[0], 1), chunk_tokens):
        h, y = states[start : start + chunk_tokens], targets[start : start + chunk_tokens]
        if use_checkpoint:
            pieces.append(checkpoint(_chunk_logp, head, h, y, use_reentrant=False))
        else:
            pieces.append(_chunk_logp(head, h, y))
    return torch.cat(pieces)


def row_logprobs(model, rows: StepRecord, pad_id: int, device: torch.device | str = "cpu",
                 chunk_tokens: int | None = 4096, share_prompts: bool = True) -> tuple[Tensor, Tensor]:
    """log pi(o_t | q, o_<t) of each row's response tokens, response-aligned: ``(logp, mask)``,
    both [B, R] with R the longest response, ``logp[b, t]`` the log-prob of row b's t-th
    response token (0 past its end, where ``mask`` is 0); the gradient reaches the model. ``rows``:
    a record with the token columns ``prompt_ids`` and ``response_ids``
    (:data:`workers.receiver.retokenize.TOKENS`).

    Rows that share a prompt (a GRPO group's n responses, a grafted peer group) share its
    prefix: with ``share_prompts`` (and a model :func:`chunkable` says is a plain causal LM
    whose KV cache can be re-indexed), each distinct prompt but its last token runs through
    the backbone ONCE, its KV cache (with its autograd graph) is indexed out to the rows,
    and only [last prompt token + response] runs per row (:func:`_shared_prompt_logprobs`).
    With ~50-token prompts and n = 8 that is about a third of the tokens of one row per
    forward, and the backward pass sums every row's gradient into the shared prefix, as the
    unshared forward's gradient does. Otherwise (all prompts distinct, or another model) the
    rows are right padded (:func:`workers.training.batching.pad_rows`) and run whole
    (:func:`sampled_logprobs`). Both give the same values to float summation order."""
    if not rows:
        raise ValueError("row_logprobs needs at least one row")
    if share_prompts and chunk_tokens is not None and _can_share_prompts(model, rows):
        return _shared_prompt_logprobs(model, rows, pad_id, device, chunk_tokens)
    batch = to_device(pad_rows(rows, pad_id), device)
    full = sampled_logprobs(model, batch, chunk_tokens)  # [B, T-1]
    width = max(len(r) for r in rows["response_ids"])
    starts = torch.tensor([len(p) - 1 for p in rows["prompt_ids"]], device=full.device)
    index = (starts[:, None] + torch.arange(width, device=full.device)).clamp(max=full.shape[1] - 1)
    mask = _response_mask(rows, width, full.device)
    return full.gather(1, index) * mask, mask


def _response_mask(rows: StepRecord, width: int, device) -> Tensor:
    lengths = torch.tensor([len(r) for r in rows["response_ids"]], device=device)
    return (torch.arange(width, device=device)[None, :] < lengths[:, None]).float()


def _can_share_prompts(model, rows: StepRecord) -> bool:
    distinct = {tuple(p) for p in rows["prompt_ids"]}
    return len(distinct) < len(rows) and min(len(p) for p in rows["prompt_ids"]) >= 2 and chunkable(model)


def _shared_prompt_logprobs(model, rows: StepRecord, pad_id: int, device,
                            chunk_tokens: int) -> tuple[Tensor, Tensor]:
    """The shared-prefix forward of :func:`row_logprobs`.

    1. The U distinct prompts, left padded to [U, P]; the backbone runs on all but their last
       token (the last column: left padding keeps every prompt's last token there), with the
       positions ``generate`` gives left-padded rows (mask cumsum - 1, 1 on padding), and
       returns its KV cache;
    2. the cache is indexed to the B rows (each row's prompt; a differentiable gather,
       :func:`workers.rollout.prefix.select_rows`), so each row attends to its own prompt's
       keys and values;
    3. per row, [last prompt token, response tokens] right padded to [B, R + 1] runs with
       that cache, attention mask [prompt mask | tail mask], positions continuing the
       prompt's (1 on padding); hidden state t predicts tail token t + 1, i.e. response
       token t, whose log-prob the chunked head gives (``_head_logprobs``).
    """
    hf = _hf_model(model)
    backbone = hf.base_model
    prompts: dict[tuple[int, ...], int] = {}
    which = [prompts.setdefault(tuple(p), len(prompts)) for p in rows["prompt_ids"]]
    width_p = max(len(p) for p in prompts)
    prompt_ids = torch.full((len(prompts), width_p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(prompts), width_p), dtype=torch.long)
    for i, ids in enumerate(prompts):
        prompt_ids[i, width_p - len(ids):] = torch.tensor(ids)
        prompt_mask[i, width_p - len(ids):] = 1
    prompt_ids, prompt_mask = prompt_ids.to(device), prompt_mask.to(device)
    index = torch.tensor(which, device=device)
    cache = prefill(backbone, prompt_ids, prompt_mask)
    select_rows(cache, index)

    width_r = max(len(r) for r in rows["response_ids"])
    tail = torch.full((len(rows), width_r + 1), pad_id, dtype=torch.long)
    tail_mask = torch.zeros((len(rows), width_r + 1), dtype=torch.long)
    tail_positions = torch.ones((len(rows), width_r + 1), dtype=torch.long)
    for b, (prompt, response) in enumerate(zip(rows["prompt_ids"], rows["response_ids"], strict=True)):
        length = len(response) + 1
        tail[b, :length] = torch.tensor([prompt[-1], *response])
        tail_mask[b, :length] = 1
        tail_positions[b, :length] = torch.arange(len(prompt) - 1, len(prompt) - 1 + length)
    tail, tail_mask, tail_positions = (t.to(device) for t in (tail, tail_mask, tail_positions))
    attention = torch.cat([prompt_mask[index, :-1], tail_mask], dim=1)
    hidden = backbone(input_ids=tail, attention_mask=attention, position_ids=tail_positions,
                      use_cache=True, **{cache_argument(backbone): cache}).last_hidden_state  # [B, R + 1, H]
    mask = tail_mask[:, 1:].float()
    where = mask != 0
    logp = _head_logprobs(hf, hidden[:, :-1][where], tail[:, 1:][where], where, chunk_tokens)
    return logp * mask, mask


def pack_by_tokens(lengths: Sequence[int], max_tokens: int, ranks: int = 1) -> list[list[int]]:
    """Row indices split into micro-batches whose forwards have padded size <= ``max_tokens``.

    ``lengths[i]`` is row i's full sequence length (prompt + response). A forward's padded
    size is ``len(rows) * max(lengths of its rows)``, what :func:`pad_rows` allocates. With
    ``ranks`` data-parallel ranks sharing each micro-batch, each taking every ``ranks``-th of its
    rows (``workers.training.update_loop``), a rank's forward holds at most ceil(rows / ranks)
    of them, none longer than the micro-batch's longest, so the rule bounds

        ceil(len(rows) / ranks) * max(lengths of its rows) <= max_tokens

    (``ranks`` 1: the micro-batch's own padded size). Rule: order the rows by length, longest
    first (a stable sort, so equal lengths keep index order), then fill micro-batches greedily
    in that order, starting a new one when the next row would push that bound past
    ``max_tokens``. A row longer than ``max_tokens`` therefore sits alone. Since each
    micro-batch holds rows of adjacent lengths, padding stays small, and greedy filling of the
    sorted order gives the fewest micro-batches among splits into runs of that order.

    Returns the micro-batches longest first (an out-of-memory shows at the first one),
    each as ascending row indices; every index appears exactly once; deterministic.
    """
    if max_tokens < 1 or ranks < 1:
        raise ValueError(f"max_tokens and ranks must be >= 1, got {max_tokens} and {ranks}")
    if any(n < 0 for n in lengths):
        raise ValueError("lengths must be >= 0")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        # The first row of a micro-batch is its longest, since rows come longest first.
        if current and -(-(len(current) + 1) // ranks) * lengths[current[0]] > max_tokens:
            batches.append(sorted(current))
            current = []
        current.append(i)
    if current:
        batches.append(sorted(current))
    return batches
