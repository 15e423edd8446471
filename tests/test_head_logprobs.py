"""The LM head's log-probs with a hand-written backward (workers/training/head_logprobs.py): the
checkpointed autograd path's values and gradients, and one chunk's logits alive at a time."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.test_logprobs import memory_growth
from workers.training.head_logprobs import fused_head_applies, head_logprobs


def head_case(bias: bool, frozen: bool, n: int = 23, hidden: int = 16, vocab: int = 97):
    g = torch.Generator().manual_seed(0)
    head = nn.Linear(hidden, vocab, bias=bias)
    with torch.no_grad():
        head.weight.copy_(torch.randn(vocab, hidden, generator=g))
        if bias:
            head.bias.copy_(torch.randn(vocab, generator=g))
    head.requires_grad_(not frozen)
    states = torch.randn(n, hidden, generator=g, requires_grad=True)
    targets = torch.randint(0, vocab, (n,), generator=g)
    upstream = torch.randn(n, generator=g)  # dL/dlogp of a loss that is not a plain sum
    return head, states, targets, upstream


def grads_of(fn, head, states, targets, upstream, autocast: bool):
    head.zero_grad(set_to_none=True)
    states.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logp = fn(head, states, targets)
    (logp * upstream).sum().backward()
    params = {name: p.grad for name, p in head.named_parameters()}
    return logp.detach(), states.grad.clone(), params


@pytest.mark.parametrize("chunk", [5, 4096])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("autocast", [False, True])
def test_the_values_and_gradients_of_the_checkpointed_chunks(chunk, bias, frozen, autocast):
    # the autograd path through torch.utils.checkpoint (imported here: the memory test runs without it)
    from workers.training.logprobs import _checkpointed_chunks

    head, states, targets, upstream = head_case(bias, frozen)
    assert fused_head_applies(head)
    want = grads_of(lambda h, s, y: _checkpointed_chunks(h, s, y, chunk), head, states, targets, upstream, autocast)
    got = grads_of(lambda h, s, y: head_logprobs(h, s, y, chunk), head, states, targets, upstream, autocast)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=1e-6)  # the values: op for op
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-6)  # dL/dh
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():
        if frozen:
            assert grad is None and got[2][name] is None
        else:
            assert got[2][name].dtype == grad.dtype
            torch.testing.assert_close(got[2][name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert want[1].abs().max() > 0


def test_only_a_plain_linear_head_is_computed_by_hand():
    class Scaled(nn.Linear):  # e.g. an adapter-wrapped or rescaled head: more than h W^T + b
        def forward(self, x):
            return 2 * super().forward(x)

    assert fused_head_applies(nn.Linear(4, 8)) and not fused_head_applies(Scaled(4, 8))
    assert not fused_head_applies(nn.Embedding(8, 4))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RssAnon from /proc")
def test_a_chunk_backward_holds_about_one_chunk_of_logits():
    """2 rows x 160 tokens, 310 response tokens in ONE chunk of a 100 k vocabulary (118 MiB of fp32
    logits): the forward and backward of the GRPO loss through sampled_logprobs grow the process's
    anonymous memory by about one chunk of logits (measured 133 MiB); autograd through the
    checkpointed chunk held four (475 MiB: the recomputed logits, exp(z - lse), the gather's
    scattered one-hot and their sum), and its forward two (logits and logsumexp's z - max)."""
    rows, width, vocab, hidden, chunk = 2, 160, 100_000, 32, 512
    got = memory_growth(rows, width, vocab, hidden, chunk)
    chunk_logits = got["tokens"] * vocab * 4
    assert got["tokens"] <= chunk  # one chunk: every response token's logits at once
    # one chunk's logits, the head weight's gradient and the embedding's ([V, H] each), slack for the
    # backbone's activations and the allocator; the autograd path's four buffers do not fit
    bound = 2 * chunk_logits + 2 * got["params"] + 32 * 2**20
    print(f"{got['tokens']} tokens in one chunk of a {vocab}-token head: grew {got['chunked'] / 2**20:.0f} MiB "
          f"(one chunk of fp32 logits {chunk_logits / 2**20:.0f} MiB, bound {bound / 2**20:.0f} MiB)")
    assert got["chunked"] < bound
