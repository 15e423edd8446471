"""Generation that overlaps training, measured (``make bench-async``): ``run.async`` off against
one_step, side by side in one invocation, on this machine.

1. **Step throughput, the demo pair** (``configs/demo_pair.yaml``: two models, 32 prompts x 8,
   4 minibatches, GRAFT, no evaluation): median seconds per step over steps 2..N of N + 1 (the
   last runs untimed: under one_step it samples nothing ahead, a lighter step) for
   ``off`` (the default: pi_old recomputed, the minibatches being 4), ``off`` with
   ``algorithm.old_logprobs: sampling`` (no recompute pass: what one_step skips too, so the
   overlap's own share shows) and ``one_step``.
2. **Step throughput, the 13.7 M model of the step benchmark** (``benchmarks/step_runs.py``: one
   model, 16 prompts x 8, 16 new tokens, generation 1 CPU + trainer 1 CPU): ``off`` against
   ``one_step``. Synchronous, each phase's actor runs torch on both cores in turn; overlapped, the
   trainer keeps both cores and the replica samples on one, niced, with neither spinning while it
   waits (``orchestrator.cluster.model_actors``: ``threads_for``, ``SHARED_CORES_ENV``).
3. **Learning at equal steps**: the demo pair, ``--learn-steps`` steps, held-out pass@1 (the
   average of its eval sets) at the end, ``off`` against ``one_step`` on ``--seeds`` seeds,
   paired by seed (``benchmarks/paired_report.PairedTest``: the mean difference and its 95%
   interval).

Each throughput row runs ``--rounds`` times, the rows interleaved (their order rotated a round),
so that a drift of the machine's speed falls on every row alike; a row's speed-up is the mean of
its rounds' (off's median over its own, in the same round), with a 95% t interval over rounds.
Each step's busy CPU seconds (the whole machine's, ``/proc/stat``) give the CPU floor: one_step's
busy CPU seconds a step over the cores is the shortest step any overlap could reach on this
machine while a step's work stays the same. For the synchronous row the report also gives what a
machine with the replicas and the trainers on separate devices would get, estimated from its
phases: a synchronous step costs generate + the rest, an overlapped one max(generate, the rest).
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


def rotated(labels: list[str], round_index: int) -> list[str]:
    """The rows' order in round ``round_index``: rotated by one a round, so that no row always
    runs first (after Ray's start) or last (on a machine warmed by the others)."""
    shift = round_index % len(labels)
    return labels[shift:] + labels[:shift]


def pair_throughput(steps: int, rounds: int, workdir: Path, seed: int) -> list[dict[str, dict]]:
    """Each demo-pair row's timed steps (``benchmarks.step_runs.run_controller``: 2..``steps``,
    then one untimed), ``rounds`` times, the rows interleaved."""
    from benchmarks.step_runs import run_controller
    from orchestrator.config import load_config

    out: list[dict[str, dict]] = []
    for r in range(rounds):
        out.append({})
        for label in rotated(list(PAIR_ROWS), r):
            config = load_config(DEMO, [f"run.name=async-pair-{r}-{len(out[-1])}", f"run.steps={steps + 1}",
                                        "run.eval_every=0", f"run.seed={seed}", f"run.output_dir={workdir}",
                                        f"tracking.uri=sqlite:///{workdir / 'async.db'}", *PAIR_ROWS[label]])
            config.data.eval = []
            print(f"demo pair, round {r + 1}/{rounds}, {label}:", flush=True)
            out[-1][label] = run_controller(config, steps + 1, untimed_tail=1)
    return out


def large_throughput(steps: int, rounds: int, workdir: Path, seed: int) -> list[dict[str, dict]]:
    """The step benchmark's 13.7 M model, fp32, off and one_step, ``rounds`` times interleaved
    (steps 2..N of N + 1 timed, as for the demo pair)."""
    from benchmarks.step_runs import SIDE, graftpool_grpo

    rows = {"off": [], "one_step": ["run.async=one_step"]}
    return [{label: graftpool_grpo("large", SIDE["graftpool-fp32"], steps + 1, seed, workdir, rows[label],
                                   untimed_tail=1)
             for label in rotated(list(rows), r)} for r in range(rounds)]


def summarize(rounds: list[dict[str, dict]], base: str = "off") -> dict[str, dict]:
    """Each row over the rounds: the median of its rounds' median step times, phases and busy CPU
    seconds, and its speed-up over ``base`` round by round (``base``'s median / the row's, in
    the same round) with their mean and 95% interval (``PairedTest``: a t interval over rounds)."""
    rows: dict[str, dict] = {}
    for label in rounds[0]:
        runs = [r[label] for r in rounds]
        ratios = tuple(r[base]["median_s"] / r[label]["median_s"] for r in rounds)
        test = PairedTest(ratios)
        rows[label] = {
            "median_s": statistics.median(run["median_s"] for run in runs),
            "busy_cpu_s": statistics.median(run["busy_cpu_s"] for run in runs),
            "phases": {p: statistics.median(run["phases"][p] for run in runs) for p in runs[0]["phases"]},
            "speedup_per_round": ratios, "speedup_mean": test.mean, "speedup_interval": test.interval,
        }
    return rows


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


def throughput_table(title: str, rows: dict[str, dict], cores: int, base: str = "off") -> list[str]:
    lines = [f"### {title}", "", "| row | median s / step | steps / min | vs off, mean of rounds | 95% interval | "
             "per round | generate | verify | score | train | sync | busy CPU s / step | CPU in use | "
             "separate devices (est.) |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in rows.items():
        p = r["phases"]
        split = f"{_device_split(p):.2f}x" if label == base else "-"
        low, high = r["speedup_interval"]
        lines.append(f"| {label} | {r['median_s']:.3f} | {60 / r['median_s']:.1f} | {r['speedup_mean']:.2f}x | "
                     f"[{low:.2f}x, {high:.2f}x] | " + " ".join(f"{x:.2f}" for x in r["speedup_per_round"])
                     + f" | {p['generate']:.3f} | {p['verify']:.3f} | {p['score']:.3f} | {p['train']:.3f} | "
                     f"{p['sync']:.3f} | {r['busy_cpu_s']:.3f} | {r['busy_cpu_s'] / (cores * r['median_s']):.0%} | "
                     f"{split} |")
    overlapped = rows.get("one_step")
    if overlapped is not None:
        floor = overlapped["busy_cpu_s"] / cores
        least = min(rows, key=lambda label: rows[label]["busy_cpu_s"])
        lines += ["", f"CPU floor of one_step: its busy CPU seconds a step over {cores} cores = {floor:.3f} s a step, "
                  f"{rows[base]['median_s'] / floor:.2f}x off: the most an overlap can give on this machine while "
                  "a step's work stays what it is."]
        if least != "one_step":
            least_floor = rows[least]["busy_cpu_s"] / cores
            lines[-1] += (f" With the least work of any row ({least}: {rows[least]['busy_cpu_s']:.3f} CPU s a step, "
                          f"overlap's own contention left out), {least_floor:.3f} s, "
                          f"{rows[base]['median_s'] / least_floor:.2f}x off.")
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


def render(report: dict) -> str:
    """``async.md`` from a report (``async.json``)."""
    settings, cores = report["settings"], report["cores"]
    lines = ["# run.async: off against one_step", "",
             f"`make bench-async` on {cores} cores ({report['cpu']}), {report['wall_s']:.0f} s. "
             "Each model's replica and trainer reserve 0.5 + 0.5 CPUs (demo pair) or 1 + 1 (13.7 M model); "
             "synchronous, each phase's actors have the model's cores in turn; overlapped, they share them "
             "(the trainer at the model's full thread count, the replicas at their share and niceness 10, "
             "`models[].generation.nice`, and no actor spinning while it waits, `OMP_WAIT_POLICY=PASSIVE`). "
             f"Each throughput row ran {settings['rounds']} times, the rows interleaved (their order rotated a "
             "round); a row's times are the median of its rounds' medians (steps 2..N; a step N + 1 ran untimed, "
             "since under one_step the last step samples nothing ahead), its speed-up the mean of "
             "its rounds' (off's median / its own, in the same round) with a 95% t interval over the rounds. "
             "Busy CPU: the whole machine's (/proc/stat), a step's median.", ""]
    lines += throughput_table(f"Demo pair, {settings['steps']} steps x {settings['rounds']} rounds", report["pair"],
                              cores) + [""]
    if "large" in report:
        lines += throughput_table(f"13.7 M model, {settings['large_steps']} steps x {settings['rounds']} rounds",
                                  report["large"], cores) + [""]
    if "learning" in report:
        lines += [f"### Learning at equal steps: demo pair, {settings['learn_steps']} steps, seeds {settings['seeds']}",
                  "", *learning_table(report["learning"]), ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10,
                        help="steps per throughput row: the median of 2..N, and a step N+1 runs untimed "
                             "(under one_step it samples nothing ahead)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="times each throughput row runs, the rows interleaved (the speed-up's interval)")
    parser.add_argument("--large-steps", type=int, default=6)
    parser.add_argument("--learn-steps", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--no-learning", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="rewrite async.md from async.json; run nothing")
    args = parser.parse_args(argv)
    if args.report_only:
        text = render(json.loads((RESULTS / "async.json").read_text()))
        (RESULTS / "async.md").write_text(text)
        print(text)
        return 0

    import ray

    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from orchestrator.cluster.placement import local_cpus
    from orchestrator.config import load_config

    start = time.perf_counter()
    # one instance for every row, sized as a controller sizes its own for the demo pair (its actors
    # reserve 2.5 CPUs; the 13.7 M model's 2)
    ray.init(**local_ray_init_kwargs(num_cpus=local_cpus(load_config(DEMO))), log_to_driver=False)
    report: dict = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "settings": {k: getattr(args, k) for k in ("steps", "rounds", "large_steps", "learn_steps", "seeds")}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            report["pair_rounds"] = pair_throughput(args.steps, args.rounds, work, 0)
            report["pair"] = summarize(report["pair_rounds"])
            if not args.no_large:
                report["large_rounds"] = large_throughput(args.large_steps, args.rounds, work, 0)
                report["large"] = summarize(report["large_rounds"])
            if not args.no_learning:
                report["learning"] = learning(args.learn_steps, args.seeds, work)
    finally:
        ray.shutdown()
    report["wall_s"] = time.perf_counter() - start
    text = render(report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "async.md").write_text(text)
    (RESULTS / "async.json").write_text(json.dumps(report, indent=1, default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
