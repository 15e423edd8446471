"""Log-probs of given tokens through a linear LM head, chunk by chunk, with a hand-written backward
that holds one chunk's logits at a time (the idea of Liger's fused linear cross-entropy).

For hidden states h [N, H], head z = h W^T + b, targets y and upstream gradient g = dL/dlogp [N]:

    log p_i   = z_{i, y_i} - logsumexp(z_i)
    dL/dz_i   = g_i (onehot(y_i) - softmax(z_i)),   softmax(z_i) = exp(z_i - logsumexp(z_i))
    dL/dh     = dL/dz W,   dL/dW = sum over chunks of dL/dz^T h,   dL/db = sum_i dL/dz_i

The forward keeps h, y and logsumexp(z) ([N] fp32), never the logits, and takes logsumexp in the
logits' own buffer. The backward recomputes a chunk's logits and turns them into dL/dz in place (``sub_``, ``exp_``, ``mul_``, ``scatter_add_``):
one [chunk, V] fp32 buffer at a time, plus dL/dW's [V, H] sum. Autograd through
``torch.utils.checkpoint`` of the same expression holds four to five such buffers in a chunk's
backward (the recomputed logits, exp(z - lse), the gather's scattered one-hot, their sum, the
head's cast), which is what the trainer's peak is made of under gradient checkpointing
(benchmarks/results/measured.md). The values are the checkpointed path's op for op; the gradients
equal it to float summation order.

The head runs in the dtype the forward gave it (the model's, or autocast's: ``bf16-mixed``), as
the full forward's does; logits are upcast to fp32 before the softmax, and each gradient is
returned in its input's dtype.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def fused_head_applies(head: nn.Module) -> bool:
    """Whether ``head`` is a plain ``nn.Linear`` (not a subclass: a LoRA-wrapped or quantised
    head computes more than ``h W^T + b``), which :func:`head_logprobs` computes by hand."""
    return type(head) is nn.Linear


def head_logprobs(head: nn.Linear, states: Tensor, targets: Tensor, chunk_tokens: int) -> Tensor:
    """log p(targets) [N] fp32 from the [N, H] ``states`` through ``head`` in chunks of
    ``chunk_tokens`` rows, with the one-buffer backward of the module docstring."""
    return _HeadLogprobs.apply(states, head.weight, head.bias, targets, chunk_tokens)


def _chunk_logits(states: Tensor, weight: Tensor, bias: Tensor | None, dtype: torch.dtype) -> Tensor:
    """z = h W^T + b in ``dtype`` (the forward's head dtype), upcast to fp32: [chunk, V]."""
    return F.linear(states.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)).float()


def _logsumexp_(logits: Tensor) -> Tensor:
    """``torch.logsumexp(logits, -1)`` op for op (max m, infinite m taken as 0, log sum exp(z - m)
    + m), computed in ``logits``' own buffer, which it overwrites: no second [chunk, V] buffer."""
    maxes = logits.amax(-1, keepdim=True)
    maxes.masked_fill_(maxes.abs() == float("inf"), 0)
    return logits.sub_(maxes).exp_().sum(-1).log_().add_(maxes[:, 0])


class _HeadLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, states: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                chunk_tokens: int) -> Tensor:
        n = states.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=states.device)
        lse = torch.empty(n, dtype=torch.float32, device=states.device)
        dtype = weight.dtype
        for start in range(0, n, chunk_tokens):
            h, y = states[start : start + chunk_tokens], targets[start : start + chunk_tokens]
            raw = F.linear(h, weight, bias)  # autocast, where on, picks the head's dtype here
            dtype = raw.dtype
            logits = raw.float()
            del raw
            picked = logits.gather(-1, y[:, None])[:, 0]
            lse[start : start + chunk_tokens] = _logsumexp_(logits)
            out[start : start + chunk_tokens] = picked - lse[start : start + chunk_tokens]
        ctx.save_for_backward(states, weight, bias, targets, lse)
        ctx.chunk_tokens, ctx.head_dtype = chunk_tokens, dtype
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        states, weight, bias, targets, lse = ctx.saved_tensors
        chunk, dtype = ctx.chunk_tokens, ctx.head_dtype
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.zeros_like(states) if need_h else None
        grad_w = grad_b = None
        w = weight.to(dtype)
        with torch.autocast(states.device.type, enabled=False):
            # Last chunk first: autograd's order for the checkpointed chunks, so the sums match it.
            for start in reversed(range(0, states.shape[0], chunk)):
                end = start + chunk
                h, y, g = states[start:end].to(dtype), targets[start:end], grad[start:end].float()
                dz = _chunk_logits(h, w, bias, dtype)
                dz.sub_(lse[start:end, None]).exp_().mul_(-g[:, None])  # -g softmax(z)
                dz.scatter_add_(1, y[:, None], g[:, None])  # + g onehot(y)
                dz = dz.to(dtype)
                if need_h:
                    grad_h[start:end] = (dz @ w).to(states.dtype)
                if need_w:
                    part = dz.t() @ h
                    grad_w = part if grad_w is None else grad_w.add_(part)
                if need_b and bias is not None:
                    part_b = dz.sum(0)
                    grad_b = part_b if grad_b is None else grad_b.add_(part_b)
                del dz
        if need_w:  # no tokens: a zero gradient, as autograd gives an empty chunk's head
            grad_w = torch.zeros_like(weight) if grad_w is None else grad_w.to(weight.dtype)
        if need_b and bias is not None:
            grad_b = torch.zeros_like(bias) if grad_b is None else grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None
