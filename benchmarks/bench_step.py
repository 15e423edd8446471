"""Step speed: GraftPool's GRPO step against TRL's GRPOTrainer on the same work
(``make bench-step``).

For each model size of :mod:`benchmarks.step_models` (~0.35 M and ~13 M parameters,
randomly initialised char-level Llamas, one saved folder loaded by both sides), the same
GRPO work runs back to back in one process tree:

1. TRL 1.16's GRPOTrainer in ``.venv-bench`` (a child process: TRL is never a project
   dependency), ``benchmarks/trl_grpo_step.py``;
2. GraftPool in this process: a real Ray controller with one model, exchange ``none``,
   ``exact`` verifier, 16 prompts x n = 8, 16 new tokens, one optimizer step per batch
   (``algorithm.minibatches: 1``), AdamW lr 1e-6, the model's placement group reserving the
   machine's cores (generation 1 CPU + trainer 1 CPU, so each actor runs 2 torch threads,
   as TRL's one process does). The prompts are the same problems as TRL's; GraftPool's
   prompt sampler visits them in its own seeded order.

A step is timed as a user sees it: ``Controller.step`` from prompt sampling to the
trajectory store and the MLflow metrics; median of steps 2..N. Also measured: tokens per
second (sampled completion tokens / step time), the phase split, the peak RSS of every
actor (``VmHWM``), and a 2-model GRAFT step against the same two models' GRPO step
(``configs/demo_pair.yaml``, warm-started zoo models, so exchange really happens).
Writes ``benchmarks/results/step.md`` and ``step.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BENCH_PY = ROOT / ".venv-bench" / "bin" / "python"
PROMPTS_PER_STEP, N, MAX_NEW_TOKENS = 16, 8, 16
PHASES = ("generate", "verify", "route", "score", "train", "sync")


def peak_rss_mib(pid: int) -> float:
    """The process's peak resident set size (``VmHWM``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def actor_peaks(controller) -> dict[str, float]:
    """Peak RSS (MiB) of every actor of a running controller, and of the driver."""
    import ray

    actors = {}
    for name, model in controller.actors.items():
        actors |= {f"{name}/generation{i}": a for i, a in enumerate(model.generators)}
        actors |= {f"{name}/trainer{r}": a for r, a in enumerate(model.trainers)}
    actors |= {f"verifier{i}": a for i, a in enumerate(controller.verifier.actors)}
    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors.values()])
    return {"driver": peak_rss_mib(os.getpid())} | {
        name: peak_rss_mib(pid) for name, pid in zip(actors, pids, strict=True)}


def run_controller(config, steps: int) -> dict[str, Any]:
    """Start a controller, time ``steps`` steps, read the actors' peak RSS, close it."""
    from orchestrator.controller.loop import Controller

    controller = Controller(config)
    controller.start()
    seconds = []
    try:
        for step in range(1, steps + 1):
            start = time.perf_counter()
            controller.step(step)
            seconds.append(time.perf_counter() - start)
            print(f"  step {step}: {seconds[-1]:.3f} s", flush=True)
        peaks = actor_peaks(controller)
    finally:
        controller.close("FINISHED")
    later = slice(1, None) if steps > 1 else slice(None)
    history = controller.state.history[later]
    tokens = [sum(m["train/response_length"] * config.algorithm.prompt_batch * config.algorithm.n
                  for m in h["models"].values()) for h in history]
    return {
        "steps": [{"step": i + 1, "seconds": s, **controller.state.history[i]["timings"]} for i, s in enumerate(seconds)],
        "median_s": statistics.median(seconds[later]),
        "phases": {p: statistics.median(h["timings"][p] for h in history) for p in PHASES},
        "completion_tokens": statistics.median(tokens),
        "grafts_per_step": statistics.mean(sum(m.get("exchange/received", 0.0) for m in h["models"].values())
                                           for h in history),
        "peak_rss_mib": peaks,
    }


def graftpool_grpo(size: str, steps: int, seed: int, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """GraftPool's GRPO step on the benchmark work (see the module docstring)."""
    from benchmarks.step_models import bench_model, bench_problems
    from orchestrator.config import load_config

    path = bench_model(size)
    data_file = workdir / f"problems-{size}.jsonl"
    with data_file.open("w") as out:
        for p in bench_problems(PROMPTS_PER_STEP * steps, seed):
            out.write(json.dumps({"problem": p.prompt, "answer": p.answer}) + "\n")
    config = load_config(data={
        "run": {"name": f"bench-step-{size}", "steps": steps, "eval_every": 0, "seed": seed,
                "output_dir": str(workdir)},
        "models": [{"name": size, "path": str(path),
                    "generation": {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 1.0, "top_p": 1.0,
                                   "num_cpus": 1},
                    "trainer": {"lr": 1e-6, "num_cpus": 1}}],
        "data": {"train": {"source": "jsonl", "path": str(data_file), "instruction": ""},
                 "verifier": "exact", "verifier_actors": 1},
        "algorithm": {"n": N, "prompt_batch": PROMPTS_PER_STEP, "minibatches": 1},
        "exchange": {"name": "none"},
        "tracking": {"uri": f"sqlite:///{workdir / 'mlflow.db'}"},
    }, overrides=overrides)
    print(f"graftpool GRPO, {size}:", flush=True)
    result = run_controller(config, steps)
    result["params"] = json.loads((path / "bench.json").read_text())["params"]
    return result


def trl_grpo(size: str, steps: int, seed: int, workdir: Path) -> dict[str, Any] | None:
    """TRL's GRPOTrainer on the same work, in the benchmark environment (a child process)."""
    if not BENCH_PY.exists():
        print(f"  no {BENCH_PY.parent.parent.name}: run `make bench-venv` for the TRL side", flush=True)
        return None
    out = workdir / f"trl-{size}.json"
    print(f"TRL GRPOTrainer, {size}:", flush=True)
    subprocess.run([str(BENCH_PY), "-m", "benchmarks.trl_grpo_step", "--size", size, "--steps", str(steps),
                    "--seed", str(seed), "--json", str(out)], cwd=ROOT, check=True)
    result = json.loads(out.read_text())
    later = result["steps"][1:] or result["steps"]
    result["median_s"] = result["median_s_steps_2_to_N"]
    result["completion_tokens"] = statistics.median(s["completion_tokens"] for s in later)
    result["phases"] = {k: statistics.median(s[f"{k}_s"] for s in later) for k in ("generate", "reward", "train")}
    return result


def graft_vs_grpo(steps: int, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """The demo pair's 2-model step with exchange ``graft`` against ``none`` (no evaluation)."""
    from orchestrator.config import load_config

    out = {}
    for exchange in ("none", "graft"):
        config = load_config(ROOT / "configs" / "demo_pair.yaml", [
            f"run.name=bench-step-pair-{exchange}", f"run.steps={steps}", "run.eval_every=0",
            f"run.output_dir={workdir}", f"exchange.name={exchange}", f"tracking.uri=sqlite:///{workdir / 'pair.db'}",
            *overrides])
        config.data.eval = []
        print(f"graftpool 2-model step, exchange {exchange}:", flush=True)
        out[exchange] = run_controller(config, steps)
    out["ratio"] = out["graft"]["median_s"] / out["none"]["median_s"]
    return out


def report(results: dict[str, Any]) -> str:
    lines = [
        "# Step speed: GraftPool vs TRL GRPOTrainer (`make bench-step`)",
        "",
        f"{results['when']}, {results['machine']}. Same work per step: one model, 16 prompts x n = 8, "
        "16 new tokens, exact-match reward, one optimizer step per batch (AdamW), fp32, randomly "
        "initialised char Llama; median of steps 2-N. GraftPool's step is `Controller.step` (store "
        "and MLflow logging included).",
        "",
        "| model | params | TRL s/step | GraftPool s/step | ratio | TRL tokens/s | GraftPool tokens/s | "
        "GraftPool phases (s) | TRL phases (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, row in results["sizes"].items():
        ours, trl = row["graftpool"], row["trl"]
        phases = ", ".join(f"{p} {ours['phases'][p]:.3f}" for p in PHASES if ours["phases"][p] >= 0.0005)
        if trl:
            trl_phases = ", ".join(f"{p} {v:.3f}" for p, v in trl["phases"].items())
            lines.append(
                f"| {size} | {ours['params'] / 1e6:.2f} M | {trl['median_s']:.3f} | {ours['median_s']:.3f} | "
                f"{ours['median_s'] / trl['median_s']:.2f}x | {trl['completion_tokens'] / trl['median_s']:.0f} | "
                f"{ours['completion_tokens'] / ours['median_s']:.0f} | {phases} | {trl_phases} |")
        else:
            lines.append(f"| {size} | {ours['params'] / 1e6:.2f} M | - | {ours['median_s']:.3f} | - | - | "
                         f"{ours['completion_tokens'] / ours['median_s']:.0f} | {phases} | - |")
    pair = results.get("pair")
    if pair:
        lines += ["", "2-model step (`configs/demo_pair.yaml`: llama-char + gpt2-bpe, prompt batch 32, n = 8, "
                  "4 minibatches, math verifier, no evaluation), median of steps 2-N:", "",
                  "| exchange | s/step | groups grafted per step (both models) | phases (s) |", "|---|---|---|---|"]
        for exchange in ("none", "graft"):
            phases = ", ".join(f"{p} {pair[exchange]['phases'][p]:.3f}" for p in PHASES)
            lines.append(f"| {exchange} | {pair[exchange]['median_s']:.3f} | {pair[exchange]['grafts_per_step']:.1f} | "
                         f"{phases} |")
        lines += ["", f"GRAFT step / GRPO step: **{pair['ratio']:.2f}x**"]
    lines += ["", "Peak RSS per process (MiB, `VmHWM`):", "", "| run | process | peak RSS |", "|---|---|---|"]
    for size, row in results["sizes"].items():
        for proc, mib in row["graftpool"]["peak_rss_mib"].items():
            lines.append(f"| GraftPool {size} | {proc} | {mib:.0f} |")
        if row["trl"]:
            lines.append(f"| TRL {size} | trainer process | {row['trl'].get('peak_rss_mib', float('nan')):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "large"])
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-trl", action="store_true", help="GraftPool only")
    parser.add_argument("--no-pair", action="store_true", help="skip the 2-model GRAFT vs GRPO line")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="config override for GraftPool's runs, e.g. algorithm.old_logprobs=recompute")
    parser.add_argument("--out", type=Path, default=RESULTS / "step.md")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-step-"))
    results: dict[str, Any] = {"when": time.strftime("%Y-%m-%d"), "sizes": {},
                               "machine": f"{os.cpu_count()} CPUs, no GPU", "overrides": args.overrides}
    try:
        for size in args.sizes:
            trl = None if args.no_trl else trl_grpo(size, args.steps, args.seed, workdir)
            ours = graftpool_grpo(size, args.steps, args.seed, workdir, args.overrides)
            results["sizes"][size] = {"trl": trl, "graftpool": ours}
            if trl:
                print(f"{size}: TRL {trl['median_s']:.3f} s/step, GraftPool {ours['median_s']:.3f} s/step, "
                      f"ratio {ours['median_s'] / trl['median_s']:.2f}x", flush=True)
        if not args.no_pair:
            results["pair"] = graft_vs_grpo(args.steps, workdir, args.overrides)
            print(f"2-model GRAFT step / GRPO step: {results['pair']['ratio']:.2f}x", flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
