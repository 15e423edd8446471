"""Generation that overlaps training, measured (``make bench-async``): ``run.async`` off against
one_step, side by side in one invocation, on this machine.

1. **Step throughput, the demo pair** (``configs/demo_pair.yaml``: two models, 32 prompts x 8,
   4 minibatches, GRAFT, no evaluation): median seconds per step over steps 2..N for
   ``off`` (the default: pi_old recomputed, the minibatches being 4), ``off`` with
   ``algorithm.old_logprobs: sampling`` (no recompute pass: what one_step skips too, so the
   overlap's own share shows) and ``one_step``.
2. **Step throughput, the 13.7 M model of the step benchmark** (``benchmarks/step_runs.py``: one
   model, 16 prompts x 8, 16 new tokens, generation 1 CPU + trainer 1 CPU): ``off`` against
   ``one_step``. Synchronous, each phase's actor runs torch on both cores in turn; overlapped, the
   replica and the trainer get one core each, at once (``threads_for``).
3. **Learning at equal steps**: the demo pair, ``--learn-steps`` steps, held-out pass@1 (the
   average of its eval sets) at the end, ``off`` against ``one_step`` on ``--seeds`` seeds,
   paired by seed (``benchmarks/paired_report.PairedTest``: the mean difference and its 95%
   interval).

For each throughput row the report also gives what a machine with the replicas and the trainers
on separate devices would get, estimated from the synchronous run's phases: a synchronous step
costs generate + the rest, an overlapped one max(generate, the rest).
Writes ``benchmarks/results/async.md`` and ``async.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.paired_report import PairedTest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DEMO = ROOT / "configs" / "demo_pair.yaml"
PAIR_ROWS = {"off": [], "off, pi_old sampled": ["algorithm.old_logprobs=sampling"], "one_step": ["run.async=one_step"]}


def pair_throughput(steps: int, workdir: Path, seed: int) -> dict[str, dict]:
    """Each demo-pair row's timed steps (``benchmarks.step_runs.run_controller``)."""
    from benchmarks.step_runs import run_controller
    from orchestrator.config import load_config

    out = {}
    for label, extra in PAIR_ROWS.items():
        config = load_config(DEMO, [f"run.name=async-pair-{len(out)}", f"run.steps={steps}", "run.eval_every=0",
                                    f"run.seed={seed}", f"run.output_dir={workdir}",
                                    f"tracking.uri=sqlite:///{workdir / 'async.db'}", *extra])
        config.data.eval = []
        print(f"demo pair, {label}:", flush=True)
        out[label] = run_controller(config, steps)
    return out


def large_throughput(steps: int, workdir: Path, seed: int) -> dict[str, dict]:
    """The step benchmark's 13.7 M model, fp32, off and one_step."""
    from benchmarks.step_runs import SIDE, graftpool_grpo

    return {label: graftpool_grpo("large", SIDE["graftpool-fp32"], steps, seed, workdir, extra)
            for label, extra in (("off", []), ("one_step", ["run.async=one_step"]))}


def learning(steps: int, seeds: list[int], workdir: Path) -> dict[str, dict[int, dict[str, float]]]:
    """Final held-out pass@1 per model (the average of the demo's eval sets), per mode and seed."""
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    out: dict[str, dict[int, dict[str, float]]] = {}
    for mode in ("off", "one_step"):
        for seed in seeds:
            config = load_config(DEMO, [f"run.name=async-learn-{mode}-s{seed}", f"run.steps={steps}",
                                        f"run.eval_every={steps}", f"run.seed={seed}", f"run.output_dir={workdir}",
                                        f"run.async={mode}", f"tracking.uri=sqlite:///{workdir / 'async.db'}"])
            t0 = time.perf_counter()
            summary = train(config)
            out.setdefault(mode, {})[seed] = {m: s["final_pass@1"]["avg"] for m, s in summary["models"].items()}
            print(f"learning, {mode}, seed {seed}: {out[mode][seed]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def _device_split(phases: dict[str, float]) -> float:
    """The speed-up of overlapping generation with the rest of a step when the two run on separate
    devices: (generate + rest) / max(generate, rest), from a synchronous step's median phases."""
    generate = phases["generate"]
    rest = sum(v for k, v in phases.items() if k != "generate")
    return (generate + rest) / max(generate, rest)


def throughput_table(title: str, rows: dict[str, dict], base: str = "off") -> list[str]:
    lines = [f"### {title}", "", "| row | median s / step | steps / min | vs off | generate | verify | score | "
             "train | sync | separate devices (est.) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        p = r["phases"]
        split = f"{_device_split(p):.2f}x" if label == base else "-"
        lines.append(f"| {label} | {r['median_s']:.3f} | {60 / r['median_s']:.1f} | "
                     f"{rows[base]['median_s'] / r['median_s']:.2f}x | {p['generate']:.3f} | {p['verify']:.3f} | "
                     f"{p['score']:.3f} | {p['train']:.3f} | {p['sync']:.3f} | {split} |")
    return lines


def learning_table(results: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    seeds = sorted(results["off"])
    models = list(results["off"][seeds[0]])
    lines = ["| model | off (mean over seeds) | one_step | one_step - off, per seed | mean difference | 95% interval |",
             "|---|---|---|---|---|---|"]
    for model in models:
        diffs = tuple(results["one_step"][s][model] - results["off"][s][model] for s in seeds)
        test = PairedTest(diffs)
        low, high = test.interval
        lines.append(f"| {model} | {statistics.mean(results['off'][s][model] for s in seeds):.3f} | "
                     f"{statistics.mean(results['one_step'][s][model] for s in seeds):.3f} | "
                     + " ".join(f"{d:+.3f}" for d in diffs) + f" | {test.mean:+.3f} | [{low:+.3f}, {high:+.3f}] |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per throughput row (median of 2..N)")
    parser.add_argument("--large-steps", type=int, default=6)
    parser.add_argument("--learn-steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--no-learning", action="store_true")
    args = parser.parse_args(argv)

    import ray

    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from orchestrator.cluster.placement import local_cpus
    from orchestrator.config import load_config

    start = time.perf_counter()
    # one instance for every row, sized as a controller sizes its own for the demo pair (its actors
    # reserve 2.5 CPUs; the 13.7 M model's 2)
    ray.init(**local_ray_init_kwargs(num_cpus=local_cpus(load_config(DEMO))), log_to_driver=False)
    report: dict = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            report["pair"] = pair_throughput(args.steps, work, 0)
            if not args.no_large:
                report["large"] = large_throughput(args.large_steps, work, 0)
            if not args.no_learning:
                report["learning"] = learning(args.learn_steps, args.seeds, work)
    finally:
        ray.shutdown()
    report["wall_s"] = time.perf_counter() - start
    lines = ["# run.async: off against one_step", "",
             f"`make bench-async` on {report['cores']} cores ({report['cpu']}), {report['wall_s']:.0f} s. "
             "Each model's replica and trainer reserve 0.5 + 0.5 CPUs (demo pair) or 1 + 1 (13.7 M model); "
             "synchronous, each phase's actors have the model's cores in turn; overlapped, they share them.", ""]
    lines += throughput_table(f"Demo pair, {args.steps} steps", report["pair"]) + [""]
    if "large" in report:
        lines += throughput_table(f"13.7 M model, {args.large_steps} steps", report["large"]) + [""]
    if "learning" in report:
        lines += [f"### Learning at equal steps: demo pair, {args.learn_steps} steps, seeds {args.seeds}", "",
                  *learning_table(report["learning"]), ""]
    text = "\n".join(lines)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "async.md").write_text(text)
    (RESULTS / "async.json").write_text(json.dumps(report, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
