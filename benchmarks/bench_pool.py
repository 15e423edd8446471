"""``make bench-pool``: how a pool's step grows with its number of models N (issue #52).

For each N in ``--sizes`` (default 2 3 4 6 8) a pool of N tiny heterogeneous models (the
zoo's three architectures x two tokenizer kinds, each warm-started strong on two of six tasks,
:func:`pool_models`) runs the same per-model work (``--prompts`` prompts x n = 8 rollouts of up
to 32 tokens, 4 minibatches, 1 CPU for each generation replica and trainer), twice: exchange
``none`` (GRPO, the work without an exchange) and ``pool`` routing with
``--donor`` (default ``most_compatible``, which scores every eligible donor group under each
receiver: up to N(N-1) donor-receiver pairs a step) and ``balance: pool``. Each run takes
``--steps`` steps; figures are medians over steps 2..end (the first warms up), through
``benchmarks.step_runs.run_controller``: seconds per step by phase, peak RSS per process,
groups moved per step.

The exchange's own cost per step is the pool run's ``route`` phase (routing, building the
train record and, for its graft rows, the donors' answer starts) plus its compatibility scoring (the ``score`` phase above the GRPO run's, which
scores pi_old alone); its share is that over the pool run's step. Each figure is fitted as
a * N^b over the sizes run (least squares in log-log): b says how it grows.

Projected, not measured: the step at one GPU per model. On this machine the N models share
``os.cpu_count()`` cores, so per-model phases (generate, train, sync, the receivers' scoring)
take about N / cores times as long as on a machine with one device per model; the driver's
phases (verify's dispatch, route) do not shrink. The projection is per-model phases x
cores / N + route, stated as such in the output.

The figure (``bench_pool.png``: the step by phase against N, the exchange's cost and share) and
a table (``bench_pool.md``) are written beside the JSON (:mod:`benchmarks.pool_scaling_report`).

    .venv/bin/python -m benchmarks.bench_pool [--sizes 2 3 4 6 8] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.pool_scaling_report import markdown, plot

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("add", "sub", "mod", "linear", "digits", "count")
ARCHS = (("llama", "char"), ("gpt2", "bpe"), ("qwen2", "char"), ("llama", "bpe"), ("gpt2", "char"), ("qwen2", "bpe"))
PER_MODEL_PHASES = ("generate", "train", "sync")


def pool_models(n_models: int) -> list[dict[str, Any]]:
    """N distinct models: architecture x tokenizer cycling, each strong on two tasks (0.4 each)."""
    models = []
    for i in range(n_models):
        arch, tokenizer = ARCHS[i % len(ARCHS)]
        strong = {TASKS[(2 * i) % len(TASKS)], TASKS[(2 * i + 1) % len(TASKS)]}
        sft = {task: 0.4 if task in strong else 0.025 for task in TASKS}
        models.append({"name": f"m{i}-{arch}-{tokenizer}",
                       "builder": {"arch": arch, "tokenizer": tokenizer, "seed": 11 + i, "sft_tasks": sft},
                       "generation": {"max_new_tokens": 32, "num_cpus": 1},
                       "trainer": {"lr": 1.0e-4, "num_cpus": 1}})
    return models


def pool_config(n_models: int, exchange: dict, steps: int, prompts: int, workdir: Path):
    from orchestrator.config import load_config

    name = f"bench-pool-{n_models}-{exchange['name']}"
    return load_config(data={
        "run": {"name": name, "steps": steps, "eval_every": 0, "seed": 0, "output_dir": str(workdir)},
        "models": pool_models(n_models),
        "data": {"train": {"tasks": list(TASKS), "size": 1024, "seed": 0}, "verifier": "math",
                 "verifier_actors": 2},
        "algorithm": {"n": 8, "prompt_batch": prompts, "minibatches": 4},
        "exchange": exchange,
        "ray": {"num_cpus": max(2 * n_models + 2, os.cpu_count() or 1)},
        "tracking": {"uri": f"sqlite:///{workdir / 'mlflow.db'}"},
    })


def fit_power(sizes: list[int], values: list[float]) -> dict[str, float]:
    """a * N^b by least squares on log-log (values > 0 only); nan when fewer than 2 points."""
    pairs = [(n, v) for n, v in zip(sizes, values, strict=True) if v > 0]
    if len(pairs) < 2:
        return {"a": float("nan"), "b": float("nan")}
    b, log_a = np.polyfit(np.log([n for n, _ in pairs]), np.log([v for _, v in pairs]), 1)
    return {"a": float(math.exp(log_a)), "b": float(b)}


def one_size(n_models: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from benchmarks.step_runs import run_controller
    from orchestrator.models import build_models

    exchanges = {"grpo": {"name": "none"},
                 "pool": {"name": "pool", "params": {"donor": args.donor, "balance": "pool"}}}
    out: dict[str, Any] = {"n_models": n_models}
    for key, exchange in exchanges.items():
        config = pool_config(n_models, exchange, args.steps, args.prompts, workdir)
        build_models(config.models, jobs=os.cpu_count() or 1, report=lambda line: print(line, flush=True))
        print(f"[bench-pool] N = {n_models}, exchange {exchange}", flush=True)
        result = run_controller(config, args.steps)
        step = sum(result["phases"].values())
        out[key] = {"phases": result["phases"], "step_s": step, "median_wall_s": result["median_s"],
                    "groups_moved": result["grafts_per_step"] / config.algorithm.n,
                    "peak_rss_mib": result["peak_rss_mib"], "max_actor_peak_mib": max(
                        v for k, v in result["peak_rss_mib"].items() if k != "driver")}
    grpo, pool = out["grpo"], out["pool"]
    compat = max(pool["phases"]["score"] - grpo["phases"]["score"], 0.0)
    out["exchange_s"] = pool["phases"]["route"] + compat
    out["exchange_share"] = out["exchange_s"] / pool["median_wall_s"]
    cores = os.cpu_count() or 1
    per_model = sum(pool["phases"][p] for p in PER_MODEL_PHASES) + pool["phases"]["score"]
    out["projected_one_device_per_model_s"] = per_model * min(cores, n_models) / n_models + pool["phases"]["route"] \
        + pool["phases"]["verify"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 3, 4, 6, 8])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--donor", default="most_compatible")
    parser.add_argument("--quick", action="store_true", help="N = 2, 3, 4 and 3 steps (make bench-pool QUICK=1)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_pool.json")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.steps = [n for n in args.sizes if n <= 4], 3
    if min(args.sizes) < 2 or args.steps < 2:
        parser.error("--sizes must be >= 2 and --steps >= 2 (step 1 warms up)")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-pool-") as tmp:
        for n_models in args.sizes:
            results.append(one_size(n_models, args, Path(tmp)))
            r = results[-1]
            print(f"[bench-pool] N = {n_models}: step {r['pool']['median_wall_s']:.2f} s (GRPO "
                  f"{r['grpo']['median_wall_s']:.2f} s), exchange {r['exchange_s']:.3f} s "
                  f"({r['exchange_share']:.1%}), {r['pool']['groups_moved']:.1f} groups moved, "
                  f"largest actor {r['pool']['max_actor_peak_mib']:.0f} MiB", flush=True)
    sizes = [r["n_models"] for r in results]
    fits = {f"pool {p}": fit_power(sizes, [r["pool"]["phases"][p] for r in results])
            for p in results[0]["pool"]["phases"]}
    fits |= {"pool step": fit_power(sizes, [r["pool"]["median_wall_s"] for r in results]),
             "exchange": fit_power(sizes, [r["exchange_s"] for r in results]),
             "projected one device per model": fit_power(sizes, [r["projected_one_device_per_model_s"]
                                                                 for r in results])}
    report = {"cpu_count": os.cpu_count(), "args": {k: str(v) for k, v in vars(args).items()},
              "results": results, "fits_a_N^b": fits,
              "note": "measured: every phase, peak RSS, groups moved; projected: the step at one device per model"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    plot(report, args.out.with_suffix(".png"))
    args.out.with_suffix(".md").write_text(markdown(report))
    for name, fit in fits.items():
        print(f"  {name}: {fit['a']:.3f} * N^{fit['b']:.2f}")
    print(f"[bench-pool] written {args.out} and its .png / .md")


if __name__ == "__main__":
    main()
