"""The ``hf`` backend's log-probs of sampled tokens take one step's logits at a time: on a GPU
with a 152 k vocabulary, stacking every step's logits, casting them to fp32 and log-softmaxing
them made three more copies of what ``generate`` already holds (256 rows x 512 steps: 199 GB)."""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile

from workers.rollout.generation import sampled_logprobs


def _peak_bytes(fn) -> int:
    """The most host memory tensors allocated inside ``fn`` held at once (torch's profiler: each
    allocation and free of a leaf op, in time order)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    leaves = sorted((e for e in prof.events() if e.self_cpu_memory_usage and not e.cpu_children),
                    key=lambda e: e.time_range.start)
    now = top = 0
    for event in leaves:
        now += event.self_cpu_memory_usage
        top = max(top, now)
    return top


def test_sampled_logprobs_hold_one_steps_fp32_logits_not_all_of_them():
    rows, steps, vocab = 8, 64, 4096
    gen = torch.Generator().manual_seed(0)
    logits = tuple(torch.randn(rows, vocab, generator=gen).bfloat16() for _ in range(steps))
    tokens = torch.randint(0, vocab, (rows, steps), generator=gen)
    whole = torch.log_softmax(torch.stack(logits, dim=1).float(), dim=-1).gather(-1, tokens[..., None])[..., 0]
    assert torch.equal(sampled_logprobs(logits, tokens), whole)
    one_step_fp32 = rows * vocab * 4
    assert _peak_bytes(lambda: sampled_logprobs(logits, tokens)) <= 4 * one_step_fp32  # all steps: 64 x
    assert sampled_logprobs((), torch.zeros(3, 0, dtype=torch.long)).shape == (3, 0)
