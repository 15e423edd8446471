"""Step speed: GraftPool's GRPO step against TRL's GRPOTrainer, at equal numerics and by length.

``make bench-step`` runs the same work on both sides, each at its best and at equal numerics,
and measures how both grow with the response length.

Work (both sides, :mod:`benchmarks.step_runs`): one randomly initialised char-level Llama of
:mod:`benchmarks.step_models` (~0.44 M or ~13.7 M parameters, one saved folder loaded by
both), 16 prompts x n = 8, temperature 1, exact-match reward, group advantages, token-mean
clipped loss, no KL, one AdamW step per batch (lr 1e-6). TRL 1.16 runs in ``.venv-bench`` as a
child process (``benchmarks/trl_grpo_step.py``: TRL is never a project dependency); GraftPool
runs in this process as a real Ray controller (generation 1 CPU + trainer 1 CPU, so each actor
runs 2 torch threads, as TRL's one process does). A GraftPool step is ``Controller.step`` from
prompt sampling to the trajectory store and the MLflow metrics; median of steps 2..N.

1. **Comparison** (``--sizes``, ``--precisions``, ``--steps``; 16 new tokens, stop at EOS):
   five sides in one table, per model size. ``fp32``: TRL with ``bf16=False`` and no gradient
   checkpointing against GraftPool ``trainer.precision: fp32`` / ``generation.dtype: float32``.
   ``bf16``: TRL's shipped defaults (``bf16=True``, ``gradient_checkpointing=True``), TRL
   ``bf16=True`` without checkpointing, and GraftPool ``trainer.precision: bf16-mixed`` /
   ``generation.dtype: bfloat16`` (on a CPU that emulates bf16, only for the small model unless
   ``--bf16-everywhere``: :func:`bf16_rows_skipped`). Measured per side: median s/step, sampled completion
   tokens per second, the phase split, peak RSS per process (``VmHWM``).
2. **Length sweep** (``--lengths``, ``--sweep-size``, ``--sweep-steps``, ``--sweep-precision``,
   ``--token-budget``, ``--trl-max-length``): :mod:`benchmarks.step_sweep`.
3. **2-model step**: GRAFT against GRPO on ``configs/demo_pair.yaml`` (warm-started zoo models,
   so exchange really happens; ``--no-pair`` skips it).

Writes ``benchmarks/results/step.md`` (``--out``) and ``step.json`` beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.cpu import BF16_HARDWARE, cpu_bf16_flags
from benchmarks.step_models import PACKAGED, bench_model
from benchmarks.step_runs import (
    EQUAL_NUMERICS,
    PHASES,
    SIDE,
    SIDES,
    Work,
    graft_vs_grpo,
    run_side,
)
from benchmarks.step_sweep import run_sweep, sweep_lines

RESULTS = Path(__file__).resolve().parent / "results"


def ratio_to_graftpool(rows: dict[str, Any], key: str) -> str:
    """GraftPool's s/step at the same numerics over a TRL side's (``-`` for GraftPool rows)."""
    side = SIDE[key]
    ours = rows.get(EQUAL_NUMERICS[side.numerics])
    if side.framework != "trl" or not ours or not rows.get(key):
        return "-"
    return f"{ours['median_s'] / rows[key]['median_s']:.2f}x"


def peak_cell(result: dict[str, Any], key: str, size: str) -> str:
    """Peak RSS (MiB): TRL's one process; GraftPool's trainer and generation actors."""
    if SIDE[key].framework == "trl":
        return f"{result['peak_rss_mib']:.0f} (process)"
    peaks = result["peak_rss_mib"]
    return f"{peaks[f'{size}/trainer0']:.0f} trainer, {peaks[f'{size}/generation0']:.0f} generation"


def phases_cell(result: dict[str, Any]) -> str:
    return ", ".join(f"{p} {v:.3f}" for p, v in result["phases"].items() if v >= 0.0005)


def bf16_rows_skipped(size: str, forced: bool) -> str | None:
    """Why the bf16 rows of ``size`` are not run here (None: they are). Only the smallest model's
    run on a CPU that emulates bf16, unless ``forced`` (``--bf16-everywhere``)."""
    import torch

    if forced or size == "small" or torch.cuda.is_available():
        return None
    flags = cpu_bf16_flags()
    if any(flag in flags for flag in BF16_HARDWARE):
        return None
    return (f"not run: this CPU has none of {', '.join(BF16_HARDWARE)} (bf16 flags: {', '.join(flags) or 'none'}), "
            "so bf16 is emulated and TRL's bf16 steps on this model take minutes each; "
            "`--bf16-everywhere` runs them anyway")


def comparison_lines(comparison: dict[str, dict[str, Any]], skipped: dict[str, str] | None = None,
                     new_tokens: int = 16) -> list[str]:
    """One comparison table (every size and side at ``new_tokens``), and each side at its best."""
    lines = [
        f"## Each side at its best and at equal numerics, {new_tokens} new tokens",
        "",
        f"16 prompts x n = 8, at most {new_tokens} new tokens (stop at EOS), median of steps 2-N. The ratio is "
        "GraftPool's s/step at the same numerics (fp32 for TRL fp32; bf16-mixed for both TRL bf16 "
        "rows) over the row's: below 1x, GraftPool's step is shorter.",
        "",
        "| side | model | median s/step | tokens/s | GraftPool/TRL | peak RSS (MiB) | phases (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, rows in comparison.items():
        for key, result in rows.items():
            if result is None:
                continue
            lines.append(
                f"| {SIDE[key].label} | {size}, {result['params'] / 1e6:.2f} M | {result['median_s']:.3f} | "
                f"{result['completion_tokens'] / result['median_s']:.0f} | {ratio_to_graftpool(rows, key)} | "
                f"{peak_cell(result, key, size)} | {phases_cell(result)} |")
    lines.append("")
    for size, why in (skipped or {}).items():
        lines.append(f"- {size}, bf16 rows: {why}")
    for size, rows in comparison.items():
        best = {fw: min(((r["median_s"], k) for k, r in rows.items() if r and SIDE[k].framework == fw), default=None)
                for fw in ("graftpool", "trl")}
        if best["graftpool"] and best["trl"]:
            (ours, ours_key), (theirs, theirs_key) = best["graftpool"], best["trl"]
            lines.append(f"- {size}, each at its best: {SIDE[ours_key].label} {ours:.3f} s / {SIDE[theirs_key].label} "
                         f"{theirs:.3f} s = **{ours / theirs:.2f}x**")
    return lines


def pair_lines(pair: dict[str, Any]) -> list[str]:
    lines = ["## 2-model step", "",
             "`configs/demo_pair.yaml`: llama-char + gpt2-bpe, prompt batch 32, n = 8, 4 minibatches, math "
             "verifier, no evaluation; median of steps 2-N.", "",
             "| exchange | s/step | groups grafted per step (both models) | phases (s) |", "|---|---|---|---|"]
    for exchange in ("none", "graft"):
        phases = ", ".join(f"{p} {pair[exchange]['phases'][p]:.3f}" for p in PHASES)
        lines.append(f"| {exchange} | {pair[exchange]['median_s']:.3f} | {pair[exchange]['grafts_per_step']:.1f} | "
                     f"{phases} |")
    return lines + ["", f"GRAFT step / GRPO step: **{pair['ratio']:.2f}x**"]


def report(results: dict[str, Any]) -> str:
    """``step.md``: the comparison, the length sweep, the 2-model line."""
    lines = ["# Step speed: GraftPool vs TRL GRPOTrainer (`make bench-step`)", "",
             f"{results['when']}, {results['machine']}, `{results['command']}`. Same work per step on both "
             "sides: one model, 16 prompts x n = 8, exact-match reward, one optimizer step per batch "
             "(AdamW), randomly initialised char Llama. GraftPool's step is `Controller.step` (store and "
             "MLflow logging included).", ""]
    first = results.get("new_tokens", [16])[0]
    if results["comparison"]:
        lines += comparison_lines(results["comparison"], results.get("bf16_skipped"), first) + [""]
    for tokens, table in results.get("comparison_at", {}).items():
        lines += comparison_lines(table, None, int(tokens)) + [""]
    if results.get("sweep"):
        lines += sweep_lines(results["sweep"]) + [""]
    if results.get("pair"):
        lines += pair_lines(results["pair"]) + [""]
    return "\n".join(lines)


def machine(device: str) -> str:
    """The machine in words: its CPUs, and its GPU where the run used one."""
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return f"{os.cpu_count()} CPUs, {torch.cuda.get_device_name(0)}"
    return f"{os.cpu_count()} CPUs, no GPU"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=None,
                        help="comparison models (none: skip it; default small large, on cuda large smollm2)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: both sides on one GPU (GraftPool's replica and trainer half of it each)")
    parser.add_argument("--new-tokens", nargs="+", type=int, default=None,
                        help="the comparison's new tokens per completion, one table each (default 16; on cuda 16 256)")
    parser.add_argument("--precisions", nargs="*", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                        help="comparison numerics: fp32 (TRL fp32, GraftPool fp32), bf16 (TRL defaults, TRL bf16, "
                             "GraftPool bf16-mixed)")
    parser.add_argument("--bf16-everywhere", action="store_true",
                        help="run the bf16 rows of every size even where bf16 is emulated (a CPU without "
                             "AVX512-BF16 / AMX): there they take minutes per step")
    parser.add_argument("--steps", type=int, default=9, help="steps per comparison run (median of 2..N)")
    parser.add_argument("--lengths", nargs="*", type=int, default=None,
                        help="the sweep's new tokens per completion (none: skip the sweep; default 16 64 256 1024, "
                             "none on cuda)")
    parser.add_argument("--sweep-size", default="large")
    parser.add_argument("--sweep-steps", nargs="+", type=int, default=[3, 3, 2, 1],
                        help="steps per sweep run, one value or one per length (median of 2..N; N = 1: step 1)")
    parser.add_argument("--sweep-precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--token-budget", type=int, default=16384,
                        help="the sweep's tokens per forward / backward, both sides")
    parser.add_argument("--trl-max-length", type=int, default=256,
                        help="TRL runs in the sweep up to this many new tokens (0: GraftPool only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-trl", action="store_true", help="GraftPool only")
    parser.add_argument("--no-pair", action="store_true", help="skip the 2-model GRAFT vs GRPO line")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="config override for GraftPool's runs, e.g. algorithm.old_logprobs=recompute")
    parser.add_argument("--out", type=Path, default=RESULTS / "step.md")
    args = parser.parse_args(argv)
    if args.steps < 1 or min(args.sweep_steps) < 1:
        parser.error("--steps and --sweep-steps must be at least 1")
    cuda = args.device == "cuda"
    args.lengths = args.lengths if args.lengths is not None else ([] if cuda else [16, 64, 256, 1024])
    args.no_pair = args.no_pair or cuda  # the 2-model line is the CPU demo pair's
    args.sizes = args.sizes if args.sizes is not None else (["large", "smollm2"] if cuda else ["small", "large"])
    if any(n < 1 for n in args.lengths) or len(set(args.lengths)) != len(args.lengths):
        parser.error("--lengths must be distinct and positive")
    args.new_tokens = args.new_tokens or ([16, 256] if cuda else [16])
    if len(args.sweep_steps) == 1:
        args.sweep_steps = args.sweep_steps * len(args.lengths)
    if args.lengths and len(args.sweep_steps) != len(args.lengths):
        parser.error(f"--sweep-steps: one value, or one per length ({len(args.lengths)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench_step --device cuda: no CUDA GPU here (torch.cuda.is_available() is False); nothing to run")
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-step-"))
    command = "python -m benchmarks.bench_step " + " ".join(sys.argv[1:] if argv is None else argv)
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d"), "machine": machine(args.device),
                               "command": command.strip(), "overrides": args.overrides, "comparison": {},
                               "new_tokens": args.new_tokens}
    sides = [s for s in SIDES if s.numerics in args.precisions and not (args.no_trl and s.framework == "trl")]
    started = time.perf_counter()
    try:
        for tokens in args.new_tokens:
            table = results["comparison"] if tokens == args.new_tokens[0] else \
                results.setdefault("comparison_at", {}).setdefault(str(tokens), {})
            for size in args.sizes:
                rows = table[size] = {}
                why = bf16_rows_skipped(size, args.bf16_everywhere) if "bf16" in args.precisions else None
                if why:
                    results.setdefault("bf16_skipped", {})[size] = why
                    print(f"{size}, bf16 rows: {why}", flush=True)
                work = Work(max_new_tokens=tokens, device=args.device,
                            model_path=bench_model(size) if size in PACKAGED else None)
                for side in sides:
                    if why and side.numerics == "bf16":
                        continue
                    rows[side.key] = run_side(size, side, args.steps, args.seed, workdir, args.overrides, work)
                print(f"{size}, {tokens} new tokens: " + ", ".join(f"{k} {r['median_s']:.3f} s/step"
                                                                   for k, r in rows.items() if r), flush=True)
        if args.lengths:
            steps = dict(zip(args.lengths, args.sweep_steps, strict=True))
            results["sweep"] = run_sweep(args.sweep_size, steps, args.seed, args.sweep_precision, args.token_budget,
                                         0 if args.no_trl else args.trl_max_length, workdir, args.overrides)
        if not args.no_pair:
            results["pair"] = graft_vs_grpo(args.steps, workdir, args.overrides)
            print(f"2-model GRAFT step / GRPO step: {results['pair']['ratio']:.2f}x", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    results["wall_s"] = time.perf_counter() - started
    text = report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)
    print(f"bench-step took {results['wall_s'] / 60:.1f} min", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
