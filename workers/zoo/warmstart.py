"""Warm start (SFT) for tiny zoo models, and quick skill probes.

RL from verifiable rewards only learns on prompts where a model sometimes succeeds, so
tiny random models are first fine-tuned on (prompt, solution) pairs until they have
partial skill. The probes here (greedy accuracy, success counts of n sampled
responses) use a plain ``\\boxed{answer}`` containment check; the real verifier lives
elsewhere.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from graftpool.tasks import Problem, boxed
from workers.rollout.generation import SamplingParams, sample_completions

IGNORE_INDEX = -100


def _encode_pairs(
    tokenizer: PreTrainedTokenizerBase, problems: Sequence[Problem]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, attention mask and labels (solution + eos only) for SFT.

    Prompt and solution are tokenized separately, exactly as a rollout sees them: the
    prompt is encoded alone and the response is generated token by token after it.
    """
    eos = tokenizer.eos_token_id
    rows = []
    for p in problems:
        prompt = tokenizer(p.prompt, add_special_tokens=False)["input_ids"]
        target = tokenizer(p.solution, add_special_tokens=False)["input_ids"] + [eos]
        rows.append((prompt, target))
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for i, (prompt, target) in enumerate(rows):
        n, m = len(prompt), len(target)
        ids[i, : n + m] = torch.tensor(prompt + target)
        mask[i, : n + m] = 1
        labels[i, n : n + m] = torch.tensor(target)
    return ids, mask, labels


@contextmanager
def torch_threads(num_threads: int | None) -> Iterator[None]:
    """Temporarily set torch's intra-op threads (None: leave as is).

    Tiny models gain little from a second thread (about 25% per step when the cores
    are idle) but slow down 5-8x when another process holds a core, as in CI and
    when Ray packs several actors on one machine; so the warm start defaults to 1.
    """
    before = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _lr_factor(step: int, steps: int, warmup: int) -> float:
    """Linear warmup then cosine decay to 10%: converges fast in a few hundred steps."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1.0 + math.cos(math.pi * progress))


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 64,
    seed: int = 0,
    weight_decay: float = 0.01,
    num_threads: int | None = 1,
    device: str = "cpu",
) -> dict[str, float]:
    """Fine-tune ``model`` in place on prompt -> solution + eos; returns metrics.

    Batches are drawn with replacement from ``problems`` by a seeded generator, so the
    run is deterministic for a given seed. Runs on ``num_threads`` torch threads, on ``device``
    (the model is moved there and left on the CPU at the end).
    """
    if not problems:
        raise ValueError("warm_start needs at least one problem")
    ids, mask, labels = _encode_pairs(tokenizer, problems)
    gen = torch.Generator().manual_seed(seed)
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    warmup = max(1, min(50, steps // 10))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, steps, warmup))
    losses: list[float] = []
    start = time.perf_counter()
    model.train()
    with torch_threads(num_threads):
        for _ in range(steps):
            idx = torch.randint(len(problems), (min(batch_size, len(problems)),), generator=gen)
            width = int(mask[idx].sum(1).max())
            out = model(
                input_ids=ids[idx, :width].to(device),
                attention_mask=mask[idx, :width].to(device),
                labels=labels[idx, :width].to(device),
            )
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(out.loss.detach()))
    model.to("cpu")
    model.eval()
    tail = losses[-20:] or [float("nan")]
    return {
        "steps": float(steps),
        "first_loss": losses[0] if losses else float("nan"),
        "final_loss": sum(tail) / len(tail),
        "seconds": time.perf_counter() - start,
        "problems": float(len(problems)),
    }


def _generate_batch(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    num_samples: int,
    temperature: float | None,
) -> list[str]:
    """Flat responses, ``num_samples`` per prompt in prompt order (the rollout sampler's code)."""
    sample = bool(temperature)
    params = SamplingParams(n=num_samples if sample else 1, temperature=temperature or 0.0,
                            top_p=1.0, max_new_tokens=max_new_tokens)
    texts = [t for c in sample_completions(model, tokenizer, prompts, params) for t in c.responses]
    return texts if sample else [t for t in texts for _ in range(num_samples)]


@torch.no_grad()
def generate_texts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_new_tokens: int = 32,
    num_samples: int = 1,
    temperature: float | None = None,
    batch_size: int = 64,
    num_threads: int | None = 1,
) -> list[list[str]]:
    """Responses per prompt (left-padded batches); greedy when ``temperature`` is None or 0.

    Sampling is pure temperature sampling (no top-k/top-p), as RL rollouts use. Runs
    on ``num_threads`` torch threads (see :func:`torch_threads`).
    """
    was_training = model.training
    model.eval()
    out: list[list[str]] = []
    with torch_threads(num_threads):
        for s in range(0, len(prompts), batch_size):
            chunk = list(prompts[s : s + batch_size])
            flat = _generate_batch(
                model, tokenizer, chunk, max_new_tokens, num_samples, temperature
            )
            out.extend(flat[i * num_samples : (i + 1) * num_samples] for i in range(len(chunk)))
    model.train(was_training)
    return out


def is_correct(text: str, answer: str) -> bool:
    """Simple probe check: the response contains ``\\boxed{answer}`` exactly."""
    return boxed(answer) in text


def success_counts(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    n: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
    batch_size: int = 16,
) -> list[int]:
    """Correct responses out of ``n`` samples per problem (the GRPO group outcome).

    Uses a forked torch RNG seeded with ``seed`` so probing does not disturb callers.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        texts = generate_texts(
            model,
            tokenizer,
            [p.prompt for p in problems],
            max_new_tokens,
            n,
            temperature,
            batch_size,
        )
    return [
        sum(is_correct(t, p.answer) for t in group)
        for group, p in zip(texts, problems, strict=True)
    ]


def group_outcomes(counts: Sequence[int], n: int) -> dict[str, float]:
    """Fractions of all-fail, mixed (1..n-1 successes) and all-pass groups."""
    total = max(1, len(counts))
    return {
        "all_fail": sum(c == 0 for c in counts) / total,
        "mixed": sum(0 < c < n for c in counts) / total,
        "all_pass": sum(c == n for c in counts) / total,
        "mean_success": sum(counts) / (n * total),
    }


def task_success(counts: Sequence[int], problems: Sequence[Problem], n: int) -> dict[str, float]:
    """Per-task share of correct samples, to see which tasks a model has learned."""
    totals: dict[str, list[int]] = {}
    for c, p in zip(counts, problems, strict=True):
        totals.setdefault(p.task, []).append(c)
    return {t: round(sum(cs) / (n * len(cs)), 3) for t, cs in sorted(totals.items())}
