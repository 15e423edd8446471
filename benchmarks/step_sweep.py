"""The length sweep of ``make bench-step``: how step time and peak memory grow with the
response length, GraftPool beside TRL.

At each length L (default 16, 64, 256 and 1,024 new tokens) both sides do the comparison's
work (one model, 16 prompts x n = 8, one optimizer step per batch) with every completion
forced to exactly L tokens: EOS is masked out until L (transformers' ``min_new_tokens``,
:func:`benchmarks.step_runs.forced_length_model`), so both sides generate and train on the
same 128 x L tokens. Measured per length: the median step time (of steps 2..N; N is set per
length, since a 1,024-token step of the large model is long: with N = 1 it is step 1, warm-up
included), tokens per second, and the peak RSS (``VmHWM``) of GraftPool's trainer and
generation actors and of TRL's one process. TRL runs up to ``--trl-max-length`` new tokens.

Both sides split the batch's forward / backward at the same token budget, so that neither
keeps 128 x (prompt + L) tokens of activations alive at once: TRL takes r completions per
micro-batch (gradient accumulation, r the largest power of two dividing 128 with
r x (longest prompt + L) <= ``--token-budget``), GraftPool gets
``trainer.max_tokens_per_micro_batch = r x (longest prompt + L)`` (the same rows).

Fitted per side: the growth exponent k of y ~ L^k, the least-squares slope of log y against
log L over the lengths run, for the step time and for the peak RSS; and GraftPool's trainer
peak against the bound its token budget sets (:func:`trainer_rss_bound`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.step_runs import (
    PROMPTS_PER_STEP,
    ROWS_PER_STEP,
    SIDE,
    SWEEP_SIDES,
    Numerics,
    Work,
    forced_length_model,
    run_side,
)

SAVED_PER_LAYER = 32
"""Activation floats a decoder layer keeps per token, in units of the hidden size, for the
bound. Counted for the Llama layer (intermediate size 3 x hidden): RMSNorm input and output
2, q / k after RoPE and v 3, attention output and its contiguous copy 2, the second RMSNorm
2, MLP gate, up, SiLU(gate) and their product 4 x 3 = 12: 21 kept for the backward; plus the
gradients of one layer's activations alive at once during its backward (at most the
MLP's 3 x 3 = 9): 30, rounded up to 32."""
EXTRA_PER_TOKEN = 4
"""Activation floats per token (x hidden) outside the layers: embeddings, final norm, slack."""
LOGPROB_CHUNK_TOKENS = 1024
"""``trainer.logprob_chunk_tokens`` (its default): the rows of logits alive at once."""


def fit_exponent(xs: list[float], ys: list[float]) -> float | None:
    """k of y ~ x^k: the least-squares slope of log y on log x (None under 2 distinct x)."""
    points = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def micro_batch_rows(row_tokens: int, budget: int, rows: int = ROWS_PER_STEP) -> int:
    """The most completions per forward / backward, a power of two dividing ``rows``, whose
    padded size ``rows x row_tokens`` stays within ``budget`` tokens (at least 1)."""
    r = rows
    while r > 1 and (rows % r or r * row_tokens > budget):
        r //= 2
    return r


@dataclass(frozen=True)
class Shape:
    """What the memory bound needs of a model."""

    params: int
    hidden: int
    layers: int
    vocab: int

    @classmethod
    def of(cls, folder: Path) -> Shape:
        info = json.loads((folder / "bench.json").read_text())
        spec = info["spec"]
        return cls(info["params"], spec["hidden_size"], spec["num_layers"], info["vocab_size"])


def trainer_rss_bound(base_mib: float, shape: Shape, budget_tokens: int, row_tokens: int,
                      precision: str) -> dict[str, float]:
    """An upper bound on the trainer's peak RSS (MiB) set by its token budget, in parts:

    - ``base``: the trainer's resident size after loading, before the first step (measured:
      Python, torch, the Ray worker, the fp32 weights);
    - ``states``: fp32 gradients (4 bytes a parameter) and AdamW's two moments (8), plus the
      bf16 weight copies autocast caches under ``bf16-mixed`` (2);
    - ``activations``: 4 bytes x hidden x (SAVED_PER_LAYER x layers + EXTRA_PER_TOKEN) per
      token, for the ``budget_tokens`` of one micro-batch (fp32 bytes: an upper bound under
      autocast too);
    - ``masks``: each layer's attention mask, at most 4 bytes per (query, key) pair:
      ``budget_tokens x row_tokens`` per layer;
    - ``head``: one chunk of fp32 logits, its log-softmax and its gradient.
    Nothing in it grows with the response length but the masks (one byte-sized T^2 term). It
    counts live tensors: memory the C allocator keeps after they are freed (glibc serves tensors
    up to its raised mmap threshold from heaps that keep freed memory) is not in it, and shows
    in ``VmHWM``."""
    mib = 2**20
    states = (12 + (2 if precision == "bf16-mixed" else 0)) * shape.params
    per_token = 4 * shape.hidden * (SAVED_PER_LAYER * shape.layers + EXTRA_PER_TOKEN)
    parts = {
        "base": base_mib,
        "states": states / mib,
        "activations": budget_tokens * per_token / mib,
        "masks": 4 * shape.layers * budget_tokens * row_tokens / mib,
        "head": 3 * 4 * LOGPROB_CHUNK_TOKENS * shape.vocab / mib,
    }
    return parts | {"bound": sum(parts.values())}


def longest_prompt_tokens(folder: Path, steps: int, seed: int) -> int:
    """Tokens of the longest prompt the benchmark trains on (the model's own tokenizer)."""
    from benchmarks.step_models import bench_problems
    from workers.rollout.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(folder)
    return max(len(tokenizer(p.prompt)["input_ids"]) for p in bench_problems(PROMPTS_PER_STEP * steps, seed))


def run_sweep(size: str, steps: dict[int, int], seed: int, numerics: Numerics, budget: int,
              trl_max_length: int, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """Both sides at every length, ``steps[length]`` steps each (median of steps 2..N; with one
    step, step 1, warm-up included), TRL up to ``trl_max_length`` new tokens (0: never); then
    the fitted exponents and the bound check (see the module docstring)."""
    from benchmarks.step_models import bench_model

    folder = bench_model(size)
    shape = Shape.of(folder)
    ours, trl = (SIDE[key] for key in SWEEP_SIDES[numerics])
    rows: dict[int, dict[str, Any]] = {}
    for length in sorted(steps):
        n_steps = steps[length]
        prompt = longest_prompt_tokens(folder, n_steps, seed)
        row_tokens = prompt + length
        r = micro_batch_rows(row_tokens, budget)
        work = Work(max_new_tokens=length, force_length=True, micro_batch_rows=r, token_budget=r * row_tokens,
                    model_path=forced_length_model(folder, length, prompt, workdir))
        row: dict[str, Any] = {"steps": n_steps, "prompt_tokens": prompt, "micro_batch_rows": r, "row_tokens": row_tokens,
                               "budget_tokens": r * row_tokens, "trl": None}
        if 0 < length <= trl_max_length:
            row["trl"] = run_side(size, trl, n_steps, seed, workdir, overrides, work)
        gp = row["graftpool"] = run_side(size, ours, n_steps, seed, workdir, overrides, work)
        assert gp is not None
        trainer = f"{size}/trainer0"
        gp["trainer_bound_mib"] = trainer_rss_bound(gp["rss_after_start_mib"][trainer], shape, r * row_tokens,
                                                    row_tokens, ours.precision)
        gp["trainer_within_bound"] = gp["peak_rss_mib"][trainer] <= gp["trainer_bound_mib"]["bound"]
        rows[length] = row
        print(f"sweep {length} new tokens: GraftPool {gp['median_s']:.3f} s/step"
              + (f", TRL {row['trl']['median_s']:.3f} s/step" if row["trl"] else ""), flush=True)
    return {"size": size, "params": shape.params, "numerics": numerics,
            "token_budget": budget, "trl_max_length": trl_max_length,
            "sides": {"graftpool": ours.key, "trl": trl.key}, "lengths": rows,
            "fits": fits(rows, f"{size}/trainer0", f"{size}/generation0")}


def fits(rows: dict[int, dict[str, Any]], trainer: str, generation: str) -> dict[str, Any]:
    """Growth exponents of every measured series, over all its lengths and over the lengths
    both sides ran; and the two verdicts of the issue's targets."""
    lengths = sorted(rows)
    both = [n for n in lengths if rows[n]["trl"]]
    gp = {n: rows[n]["graftpool"] for n in lengths}
    series = {
        "graftpool_time": {n: gp[n]["median_s"] for n in lengths},
        "graftpool_trainer_rss": {n: gp[n]["peak_rss_mib"][trainer] for n in lengths},
        "graftpool_generation_rss": {n: gp[n]["peak_rss_mib"][generation] for n in lengths},
        "trl_time": {n: rows[n]["trl"]["median_s"] for n in both},
        "trl_rss": {n: rows[n]["trl"]["peak_rss_mib"] for n in both},
    }
    exponents = {name: fit_exponent(list(s), list(s.values())) for name, s in series.items()}
    shared = {name: fit_exponent(both, [s[n] for n in both]) for name, s in series.items()}
    gp_k, trl_k = shared["graftpool_time"], shared["trl_time"]
    marginal = None
    if len(both) >= 2:  # seconds a step gains per 1,000 more new tokens, between the two longest shared lengths
        a, b = both[-2], both[-1]
        marginal = {side: 1000 * (series[f"{side}_time"][b] - series[f"{side}_time"][a]) / (b - a)
                    for side in ("graftpool", "trl")} | {"from": a, "to": b}
    return {
        "exponents": exponents,
        "exponents_on_shared_lengths": shared,
        "shared_lengths": both,
        "marginal_s_per_1k_tokens": marginal,
        "graftpool_grows_no_faster": None if gp_k is None or trl_k is None else round(gp_k, 2) <= round(trl_k, 2),
        "trainer_within_bound": all(gp[n]["trainer_within_bound"] for n in lengths),
    }


def _k(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def sweep_lines(sweep: dict[str, Any]) -> list[str]:
    """The sweep's markdown: one row per length, then the exponents and the two verdicts."""
    size, gp_side, trl_side = sweep["size"], SIDE[sweep["sides"]["graftpool"]], SIDE[sweep["sides"]["trl"]]
    trainer, generation = f"{size}/trainer0", f"{size}/generation0"
    lines = [
        f"## Length sweep ({size}, {sweep['params'] / 1e6:.2f} M parameters, {gp_side.label} vs {trl_side.label})",
        "",
        f"16 prompts x n = 8, every completion forced to L new tokens on both sides (EOS masked out "
        "until L); median of steps 2-N (with N = 1, step 1, warm-up included). Forward / backward split at a token budget of "
        f"{sweep['token_budget']}: r completions per micro-batch on both sides, "
        "r x (longest prompt + L) tokens. Peak RSS in MiB (`VmHWM`); the trainer's bound is "
        "its resident size after loading + gradients and AdamW state + the activations of one "
        "micro-batch (`benchmarks/step_sweep.py`, `trainer_rss_bound`).",
        "",
        "| new tokens | steps N | r x tokens | GraftPool s/step | TRL s/step | GraftPool/TRL | GraftPool tokens/s | "
        "TRL tokens/s | GraftPool trainer peak (bound) | GraftPool generation peak | TRL process peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for length, row in sorted(sweep["lengths"].items(), key=lambda item: int(item[0])):
        gp, trl = row["graftpool"], row["trl"]
        bound = gp["trainer_bound_mib"]["bound"]
        trl_cells = (f"{trl['median_s']:.3f} | {gp['median_s'] / trl['median_s']:.2f}x", f"{trl['completion_tokens'] / trl['median_s']:.0f}",
                     f"{trl['peak_rss_mib']:.0f}") if trl else ("- | -", "-", "-")
        lines.append(
            f"| {length} | {row['steps']} | {row['micro_batch_rows']} x {row['row_tokens']} | {gp['median_s']:.3f} | {trl_cells[0]} | "
            f"{gp['completion_tokens'] / gp['median_s']:.0f} | {trl_cells[1]} | "
            f"{gp['peak_rss_mib'][trainer]:.0f} ({bound:.0f}) | {gp['peak_rss_mib'][generation]:.0f} | {trl_cells[2]} |")
    fit, shared = sweep["fits"]["exponents"], sweep["fits"]["exponents_on_shared_lengths"]
    both = ", ".join(str(n) for n in sweep["fits"]["shared_lengths"]) or "none"
    lines += [
        "",
        f"Growth exponent k of y ~ L^k (least-squares slope of log y on log L; over all lengths run, and "
        f"over the lengths both sides ran: {both}):",
        "",
        "| series | k, all lengths | k, shared lengths |",
        "|---|---|---|",
    ]
    for name, label in (("graftpool_time", "GraftPool step time"), ("trl_time", "TRL step time"),
                        ("graftpool_trainer_rss", "GraftPool trainer peak RSS"),
                        ("graftpool_generation_rss", "GraftPool generation peak RSS"),
                        ("trl_rss", "TRL process peak RSS")):
        lines.append(f"| {label} | {_k(fit[name])} | {_k(shared[name])} |")
    no_faster, marginal = sweep["fits"]["graftpool_grows_no_faster"], sweep["fits"]["marginal_s_per_1k_tokens"]
    lines += [
        "",
        "- GraftPool's step time grows no faster than TRL's (k on the shared lengths): "
        + ({True: "**yes**", False: "**no**", None: "not measured (TRL ran at fewer than 2 lengths)"}[no_faster]),
        "- GraftPool's peak trainer RSS within the bound its token budget sets at every length: "
        + ("**yes**" if sweep["fits"]["trainer_within_bound"] else "**no**"),
    ]
    if marginal:
        lines.insert(-1, f"- Seconds a step gains per 1,000 more new tokens, from {marginal['from']} to {marginal['to']}: "
                         f"GraftPool {marginal['graftpool']:.3f}, TRL {marginal['trl']:.3f} (the added cost itself; k also "
                         "rises for a side that saves a fixed cost per step, such as a shared prompt prefill)")
    return lines
