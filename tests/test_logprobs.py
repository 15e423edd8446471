"""Chunked log-probs of sampled tokens (workers/training/logprobs.py) against the full-logits path,
their peak memory, and token-budget micro-batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, CohereConfig, Gemma2Config, GraniteConfig

from graftpool.step_record import StepRecord
from workers.receiver.objective import policy_loss
from workers.receiver.retokenize import token_rows
from workers.training.batching import pad_rows, token_logprobs
from workers.training.logprobs import (
    _can_share_prompts,
    chunkable,
    pack_by_tokens,
    row_logprobs,
    sampled_logprobs,
)
from workers.zoo.model_zoo import PAD_ID, build_model

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 211
SHAPES = [(3, 5), (7, 12), (1, 1), (5, 20), (2, 9)]
"""(prompt, response) lengths: every row is right padded to 25 tokens but the longest."""


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, and far faster than two on a busy 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_batch(vocab: int = VOCAB, shapes=SHAPES, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    pairs = [(torch.randint(3, vocab, (p,), generator=g).tolist(), torch.randint(3, vocab, (r,), generator=g).tolist())
             for p, r in shapes]
    return pad_rows(token_rows([p for p, _ in pairs], [r for _, r in pairs]), PAD_ID)


def loss_and_grads(model, logp_fn, batch, old_logp, advantages, weights):
    model.zero_grad(set_to_none=True)
    logp = logp_fn(model, batch)
    loss, stats = policy_loss(logp, old_logp, advantages, weights, batch["response_mask"])
    loss.backward()
    grads = {
        name: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
        for name, p in model.named_parameters()
    }
    return logp.detach(), loss.detach(), stats, grads


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_matches_full_logits_values_loss_and_grads(arch):
    model = build_model(arch, VOCAB, hidden_size=32, num_layers=2, num_heads=2, max_positions=64)
    assert chunkable(model)
    batch = make_batch()
    mask = batch["response_mask"]
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        current = token_logprobs(model, batch)
    # Old log-probs near the current ones (some ratios outside the clip range), random A, w.
    old_logp = (current + 0.3 * torch.randn(current.shape, generator=g)) * mask
    advantages = torch.randn(mask.shape[0], generator=g)
    weights = torch.rand(mask.shape[0], generator=g)
    args = (batch, old_logp, advantages, weights)

    ref_logp, ref_loss, ref_stats, ref_grads = loss_and_grads(model, token_logprobs, *args)
    assert 0 < ref_stats["clip_frac"] < 1
    for chunk in (7, 4096):  # 7: eight chunks of the 52 response tokens; 4096: one chunk
        logp, loss, stats, grads = loss_and_grads(
            model, lambda m, b, c=chunk: sampled_logprobs(m, b, c), *args
        )
        assert logp.dtype == torch.float32 and logp.shape == ref_logp.shape
        assert torch.all(logp[mask == 0] == 0)
        logp_diff = (logp - ref_logp).abs().max().item()
        grad_diff = max((grads[n] - ref_grads[n]).abs().max().item() for n in ref_grads)
        print(f"{arch} chunk={chunk}: max |dlogp| {logp_diff:.2e}, max |dgrad| {grad_diff:.2e}")
        torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)
        torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-5)
        assert stats["n_tokens"] == ref_stats["n_tokens"]
        assert grads.keys() == ref_grads.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=1e-5, msg=name)
        assert any(grad.abs().max() > 0 for grad in grads.values())


def test_no_grad_bf16_and_fallbacks_agree():
    batch = make_batch()
    model = build_model("llama", VOCAB, hidden_size=32, num_layers=1, num_heads=2)
    with torch.no_grad():
        ref = token_logprobs(model, batch)
        out = sampled_logprobs(model, batch, chunk_tokens=5)
        assert not out.requires_grad
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
        assert torch.equal(sampled_logprobs(model, batch, chunk_tokens=None), ref)
        # bf16 weights: the head runs in bf16 as in the full path, the softmax in fp32. Equal
        # to ~5e-7 here; 1e-3 allows bf16 matmul kernels that tile the gathered rows apart.
        model.to(torch.bfloat16)
        ref16, out16 = token_logprobs(model, batch), sampled_logprobs(model, batch, 5)
        assert out16.dtype == torch.float32
        torch.testing.assert_close(out16, ref16, rtol=0, atol=1e-3)
    with pytest.raises(ValueError):
        sampled_logprobs(model, batch, chunk_tokens=0)
    model.config.logit_scale = 2.0  # a logit transform anywhere in the config: full path
    assert not chunkable(model)


@pytest.mark.parametrize(
    "config_cls, transform",
    [
        (Gemma2Config, {"final_logit_softcapping": 0.5}),
        (CohereConfig, {"logit_scale": 0.5}),
        (GraniteConfig, {"logits_scaling": 4.0}),
    ],
)
def test_logit_transforming_models_take_the_full_path(config_cls, transform):
    config = config_cls(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=16, pad_token_id=PAD_ID,
        bos_token_id=1, eos_token_id=2, **transform,
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
    batch = make_batch()
    assert not chunkable(model)
    with torch.no_grad():
        ref = token_logprobs(model, batch)
        assert torch.equal(sampled_logprobs(model, batch, chunk_tokens=7), ref)
        # The head alone would be wrong here, so the fallback is what keeps this equal.
        hidden = model.base_model(**{k: batch[k] for k in ("input_ids", "attention_mask")})[0]
        logits = model.get_output_embeddings()(hidden[:, :-1]).float()
        head_only = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None])
        assert (head_only[..., 0] * batch["response_mask"] - ref).abs().max() > 1e-2


def test_no_response_tokens_still_backpropagates_zeros():
    model = build_model("gpt2", VOCAB, hidden_size=32, num_layers=1, num_heads=2)
    batch = make_batch()
    batch["response_mask"] = torch.zeros_like(batch["response_mask"])
    out = sampled_logprobs(model, batch, chunk_tokens=7)
    assert torch.equal(out, torch.zeros_like(out))
    out.sum().backward()  # the trainer's "touch every parameter" step must still work
    head = model.get_output_embeddings().weight
    assert head.grad is not None and torch.equal(head.grad, torch.zeros_like(head))


# --- peak memory ---------------------------------------------------------------------

MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    import torch
    from workers.training.batching import pad_rows, token_logprobs
    from workers.receiver.retokenize import token_rows
    from workers.training.logprobs import sampled_logprobs
    from workers.zoo.model_zoo import build_model
    from workers.receiver.objective import policy_loss

    rows, width, vocab, hidden, chunk = map(int, sys.argv[1:6])

    def anon():  # current anonymous resident memory (what tensors take), bytes
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

    def growth(fn):
        # Peak growth of RssAnon while fn runs, sampled every 0.2 ms. Anonymous memory only:
        # the kernel may drop and re-fault clean file pages (libtorch's code) at any time, which
        # moved VmRSS and ru_maxrss by ~200 MiB in a full-suite run, but not RssAnon.
        base, peak, done = anon(), [anon()], threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], anon())
                time.sleep(0.0002)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        fn()
        done.set()
        sampler.join()
        return max(peak[0], anon()) - base

    model = build_model("llama", vocab, hidden, 1, hidden // 16, width)
    g = torch.Generator().manual_seed(0)

    def batch_of(n, length):  # 4 prompt tokens, responses of lengths length - 4 - 2b
        pairs = [(torch.randint(3, vocab, (4,), generator=g).tolist(),
                  torch.randint(3, vocab, (length - 4 - 2 * b,), generator=g).tolist()) for b in range(n)]
        return pad_rows(token_rows([p for p, _ in pairs], [r for _, r in pairs]), 0)

    def step(logp_fn, batch):  # forward + backward of the GRPO loss
        mask = batch["response_mask"]
        logp = logp_fn(model, batch)
        n = mask.shape[0]
        loss, _ = policy_loss(logp, logp.detach() + 0.01, torch.linspace(-1, 1, n),
                              torch.ones(n), mask)
        loss.backward()

    def chunked(m, b):
        return sampled_logprobs(m, b, chunk)

    # Warm up both paths on a tiny batch: one-off allocations (.grad tensors, kernel
    # workspaces, thread pools) land in the baseline.
    step(chunked, batch_of(1, 8))
    step(token_logprobs, batch_of(1, 8))
    batch = batch_of(rows, width)
    out = {"chunked": growth(lambda: step(chunked, batch)), "tokens": int(batch["response_mask"].sum()),
           "params": sum(p.numel() * p.element_size() for p in model.parameters())}
    out["unchunked"] = growth(lambda: step(token_logprobs, batch))
    print(json.dumps(out))
    """
)


def memory_growth(rows: int, width: int, vocab: int, hidden: int, chunk: int) -> dict:
    """:data:`MEMORY_SCRIPT`'s figures, run in a fresh process."""
    proc = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, *map(str, (rows, width, vocab, hidden, chunk))],
        cwd=ROOT, capture_output=True, text=True, check=False,
        # One thread: fixed per-thread scratch, and fast on a busy machine. A fixed glibc mmap
        # threshold: blocks >= 1 MiB go back to the OS when freed, so the peak RSS tracks live
        # tensors (with the default dynamic threshold, freed ~20 MiB blocks stay in the heap
        # and the chunked growth wandered between 170 and 250 MiB from run to run).
        env={**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": str(2**20)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
def test_peak_memory_is_bounded_by_the_chunk_not_the_batch():
    # Sized for a slow 2-core CPU (the V = 150k head costs ~5 ms per token forward+backward):
    # 4 rows x 96 tokens, 356 response tokens in 6 chunks of 64. The growth is the same
    # per chunk at any B x T: 8 x 1024 tokens with chunk 512 grew 1.3 GiB (~4.5 x 293 MiB).
    rows, width, vocab, hidden, chunk = 4, 96, 150_000, 32, 64
    got = memory_growth(rows, width, vocab, hidden, chunk)
    chunk_logits = chunk * vocab * 4  # one chunk's fp32 logits: 36.6 MiB
    # The bound is the checkpointed chunks' (the path of a head that is not a plain nn.Linear):
    # live at once in a chunk's backward, the recomputed logits, exp(z - lse), the gathered
    # one-hot grad and their sum (~4-5 x chunk_logits); 6 x leaves margin. This model's plain
    # Linear head takes head_logprobs' backward (one chunk buffer), well inside it. Plus 2 x the
    # parameters (the transient per-chunk head-weight grad and the embedding's dense grad,
    # [V, H] each) and 64 MiB slack for the backbone's [B, T, H] activations and allocator.
    # Nothing here grows with rows x width beyond the [B, T, H] activations.
    bound = 6 * chunk_logits + 2 * got["params"] + 64 * 2**20  # ~320 MiB
    # The full path holds [B, T, V] fp32 logits (220 MiB here), their log_softmax and, in the
    # backward, as many again for the grads: ~3-4 x 220 MiB. At the paper's 256 x 4096 x 152k
    # that is ~640 GB per copy, whatever chunk_tokens is.
    full_logits = rows * width * vocab * 4
    mib = 2**20
    print(
        f"response tokens {got['tokens']}, chunk {chunk}, vocab {vocab}: peak RSS growth "
        f"chunked {got['chunked'] / mib:.0f} MiB (bound {bound / mib:.0f} MiB), "
        f"unchunked {got['unchunked'] / mib:.0f} MiB ([B, T, V] fp32 = {full_logits / mib:.0f} MiB)"
    )
    assert got["chunked"] < bound
    assert got["unchunked"] > max(bound, 2 * full_logits)


# --- micro-batches by token budget ---------------------------------------------------


def padded(lengths, batch):
    return len(batch) * max(lengths[i] for i in batch)


def test_pack_by_tokens_examples():
    assert pack_by_tokens([], 10) == []
    # longest first; equal lengths keep index order; each micro-batch ascending
    assert pack_by_tokens([3, 5, 3, 9, 2], 10) == [[3], [0, 1], [2, 4]]
    assert pack_by_tokens([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    # rows longer than the budget sit alone
    assert pack_by_tokens([30, 1, 20, 1], 10) == [[0], [2], [1, 3]]
    # shared by 2 ranks: a rank's forward, ceil(rows / 2) x longest, within the budget
    assert pack_by_tokens([6, 6, 6, 6, 6], 12, ranks=2) == [[0, 1, 2, 3], [4]]
    assert pack_by_tokens([6, 6, 6], 10, ranks=2) == [[0, 1], [2]]
    with pytest.raises(ValueError):
        pack_by_tokens([1], 0)
    with pytest.raises(ValueError):
        pack_by_tokens([1], 4, ranks=0)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=120), max_size=60),
    max_tokens=st.integers(min_value=1, max_value=600),
)
def test_pack_by_tokens_properties(lengths, max_tokens):
    batches = pack_by_tokens(lengths, max_tokens)
    assert pack_by_tokens(list(lengths), max_tokens) == batches  # deterministic
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        assert b and b == sorted(b)
        assert len(b) == 1 or padded(lengths, b) <= max_tokens
    longest = [max(lengths[i] for i in b) for b in batches]
    assert longest == sorted(longest, reverse=True)
    # greedy: the next micro-batch's longest row would not have fitted in the previous one
    for prev, nxt in zip(batches, batches[1:], strict=False):
        assert padded(lengths, [*prev, max(nxt, key=lambda i: lengths[i])]) > max_tokens


def grouped_rows(vocab: int = VOCAB, seed: int = 0) -> StepRecord:
    """GRPO-like rows: 3 prompts of different lengths, each with several responses of
    different lengths (one empty), in mixed order, plus one prompt seen once."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (6, 11, 2, 9)]
    plan = [(0, 4), (1, 9), (0, 1), (2, 6), (1, 0), (0, 12), (2, 3), (1, 5), (3, 7)]
    responses = [torch.randint(3, vocab, (r,), generator=g).tolist() for _, r in plan]
    return token_rows([prompts[p] for p, _ in plan], responses)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_shared_prompts_give_the_unshared_values_loss_and_grads(arch):
    """row_logprobs runs each distinct prompt through the backbone once and re-indexes its
    KV cache to the rows that share it: same log-probs, loss and gradients as running every
    row whole (gpt2's learned positions included)."""
    model = build_model(arch, VOCAB, hidden_size=32, num_layers=2, num_heads=2, max_positions=64)
    rows = grouped_rows()
    assert _can_share_prompts(model, rows)  # the shared path really runs below
    g = torch.Generator().manual_seed(2)
    advantages, weights = torch.randn(len(rows), generator=g), torch.rand(len(rows), generator=g)
    results = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        logp, mask = row_logprobs(model, rows, PAD_ID, chunk_tokens=7, share_prompts=share)
        old = (logp.detach() + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(3))) * mask
        loss, stats = policy_loss(logp, old, advantages, weights, mask)
        loss.backward()
        results[share] = (logp.detach(), mask, loss.detach(), stats,
                          {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (ref, ref_mask, ref_loss, ref_stats, ref_grads), (got, mask, loss, stats, grads) = results[False], results[True]
    assert torch.equal(mask, ref_mask) and mask.sum() == sum(len(r) for r in rows["response_ids"])
    # response-aligned: row b's t-th value is the log-prob of its t-th response token
    with torch.no_grad():
        full = token_logprobs(model, pad_rows(rows, PAD_ID))
    for b, (prompt, response) in enumerate(zip(rows["prompt_ids"], rows["response_ids"], strict=True)):
        start = len(prompt) - 1
        torch.testing.assert_close(ref[b, : len(response)], full[b, start : start + len(response)],
                                   rtol=0, atol=1e-5)
    print(f"{arch}: shared vs unshared max |dlogp| {(got - ref).abs().max():.2e}")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    assert 0 < ref_stats["clip_frac"] < 1 and stats["clip_frac"] == ref_stats["clip_frac"]
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=1e-5, msg=name)


def test_select_rows_is_transformers_row_selection_with_index_selects_backward():
    """select_rows (the trainer's re-indexing of a shared prompt's KV cache) gives the rows
    ``batch_select_indices`` gives, and for rows grouped by prompt the same fp32 gradients,
    bitwise; a layer class with its own ``batch_select_indices`` is left to it."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    from workers.rollout.prefix import select_rows

    g = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(3, 2, 5, 4, generator=g, requires_grad=True) for _ in range(2))
    index = torch.tensor([0, 0, 1, 1, 1, 2])
    upstream = torch.randn(6, 2, 5, 4, generator=g)
    grads = {}
    for name in ("transformers", "select_rows"):
        cache = DynamicCache()
        cache.update(keys * 1.0, values * 1.0, 0)
        select_rows(cache, index) if name == "select_rows" else cache.batch_select_indices(index)
        layer = cache.layers[0]
        (layer.keys * upstream + layer.values * upstream).sum().backward()
        grads[name] = (layer.keys.detach(), keys.grad.clone(), values.grad.clone())
        keys.grad = values.grad = None
    for ours, theirs in zip(grads["select_rows"], grads["transformers"], strict=True):
        assert torch.equal(ours, theirs)

    class KeepsMore(DynamicLayer):
        def batch_select_indices(self, indices):
            self.selected = indices

    cache = DynamicCache()
    cache.layers = [KeepsMore()]
    select_rows(cache, index)
    assert cache.layers[0].selected is index
