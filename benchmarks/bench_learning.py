"""The paper's Table 1 at laptop scale (``make bench-learning``).

For one pair of tiny models with different architectures AND tokenizers (llama + char,
gpt2 + BPE; ``configs/learning_pair.yaml``: paper-like solution styles, each model slipping on
its peer's focus tasks) and several RL seeds, train with: GRPO n=8, 16
and 32, SGT, GRAFT, GRAFT from stored peer trajectories (each model's peer's own GRPO n=8
run of the same seed), GRAFT without the gate (w = 1), GRAFT peer-first, the transfer
ablations (success-only, pooled advantages, recentered advantages, group gate:
``workers/receiver/peer_transfer.py``), HACPO (``policies/hacpo.py``), and pool routing over 3
models (``configs/learning_pool3.yaml``). ``--pair-config configs/demo_pair.yaml --pool-config
configs/pool3.yaml --steps 30`` is the earlier, answer-dominated regime. Same prompts, steps and each
model's learning rate for every method. Writes ``benchmarks/results/table1.md`` (mean +- sd of final pass@1 per eval
set and their average), ``table1.png`` and ``complementarity.png`` (the fraction of each
model's all-fail prompts its peer solves, over training, from the GRPO n=8 runs).

The power check comes first (``benchmarks/learning_report.py``): GRPO n=8 and n=32 run
before anything else, and the report opens with whether n=32's held-out gain over n=8 is
at least 3 pooled seed sds for both models; only then can the exchange rows show anything.
``--quick`` (``make bench-learning QUICK=1``): one seed, the power check and GRPO vs GRAFT.

Runs are resumable: a run whose ``summary.json`` exists is read, not re-run.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np

from benchmarks.learning_report import power_check, power_text, run_means, train_pool_recovery
from benchmarks.paired_report import paired_text

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAIR = ROOT / "configs" / "learning_pair.yaml"
POOL = ROOT / "configs" / "learning_pool3.yaml"
RESULTS = ROOT / "benchmarks" / "results"
# the committed experiments of issue #28, from which QUICK=1 takes the best exchange configuration
EXPERIMENTS = RESULTS / "learning_pair_28" / "table1.json"


@dataclass(frozen=True)
class Method:
    name: str
    config: Path
    overrides: tuple[str, ...] = ()
    stored_from: str | None = None  # a method whose run's store donates (GRAFT stored)
    models: tuple[str, ...] = field(default=("llama-char", "gpt2-bpe"))

    @property
    def slug(self) -> str:
        return self.name.lower().replace(" ", "-").replace("=", "").replace("+", "-").replace("(", "").replace(")", "")


METHODS = [
    Method("GRPO n=8", PAIR, ("exchange.name=none",)),
    Method("GRPO n=16", PAIR, ("exchange.name=none", "algorithm.n=16")),
    Method("GRPO n=32", PAIR, ("exchange.name=none", "algorithm.n=32")),
    Method("SGT", PAIR, ("exchange.name=sgt",)),
    Method("GRAFT", PAIR, ("exchange.name=graft",)),
    Method("GRAFT stored", PAIR, (), stored_from="GRPO n=8"),
    Method("GRAFT no gate", PAIR, ("exchange.name=graft", "exchange.gate=false")),
    Method("GRAFT peer-first", PAIR, ("exchange.name=graft", "exchange.peer_placement=first")),
    Method("GRAFT success-only", PAIR, ("exchange.name=graft", "exchange.peer_responses=success")),
    Method("GRAFT pooled adv", PAIR, ("exchange.name=graft", "exchange.peer_advantages=pooled")),
    Method("GRAFT recentered", PAIR, ("exchange.name=graft", "exchange.peer_advantages=recentered")),
    Method("GRAFT group gate", PAIR, ("exchange.name=graft", "exchange.gate_scope=group")),
    Method("HACPO", PAIR, ("exchange.name=hacpo",)),
    # issue #28: the experiments that decide between its hypotheses, and the exchanges built for
    # off-policy peer data (docs/algorithm.md, "Exchange options for off-policy peer data")
    Method("GRAFT gate closed", PAIR, ("exchange.name=graft", "exchange.delta=1e9")),
    Method("GRAFT spread", PAIR, ("exchange.name=graft", "exchange.peer_placement=spread")),
    Method("GRAFT step-norm", PAIR, ("exchange.name=graft", "algorithm.loss_normalizer=step")),
    Method("GRAFT spread+step", PAIR, ("exchange.name=graft", "exchange.peer_placement=spread",
                                       "algorithm.loss_normalizer=step")),
    Method("GRAFT asymmetric", PAIR, ("exchange.name=graft", "exchange.peer_placement=spread",
                                      "algorithm.loss_normalizer=step", "exchange.peer_advantages=asymmetric",
                                      "exchange.peer_beta=0.5")),
    Method("GRAFT LUFFY", PAIR, ("exchange.name=graft", "exchange.peer_placement=spread",
                                 "algorithm.loss_normalizer=step", "exchange.peer_ratio=shaped")),
    Method("GRAFT success+spread+step", PAIR, ("exchange.name=graft", "exchange.peer_responses=success",
                                               "exchange.peer_placement=spread", "algorithm.loss_normalizer=step")),
    Method("pool (3 models)", POOL, ("exchange.name=pool",),
           models=("llama-char", "gpt2-bpe", "qwen2-char")),
]


def run_dir(method: Method, seed: int, out: Path) -> Path:
    return out / f"{method.slug}-s{seed}"


def run_one(method: Method, seed: int, steps: int | None, out: Path, common: list[str],
            configs: dict[Path, Path] | None = None) -> tuple[dict, bool]:
    """The run's summary, and whether it was trained now (False: read from an earlier invocation).
    ``configs`` maps a method's config to the regime's (``--pair-config``, ``--pool-config``)."""
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    folder = run_dir(method, seed, out)
    if (folder / "summary.json").is_file():
        return json.loads((folder / "summary.json").read_text()), False
    overrides = [*common, *([f"run.steps={steps}"] if steps is not None else []), f"run.seed={seed}", f"run.output_dir={out}",
                 f"run.name={folder.name}", *method.overrides]
    if method.stored_from:
        source = next(m for m in METHODS if m.name == method.stored_from)
        store = run_dir(source, seed, out) / "trajectories"
        overrides += ["exchange.name=stored",
                      f"exchange.params={{store: '{store}', peers: [{', '.join(method.models)}]}}"]
    return train(load_config((configs or {}).get(method.config, method.config), overrides)), True


def final_scores(summary: dict, model: str) -> dict[str, float]:
    return summary["models"][model]["final_pass@1"]


def _mean_sd(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(np.nanmean(arr)), float(np.nanstd(arr, ddof=1)) if np.isfinite(arr).sum() > 1 else 0.0


def table(results: dict[str, dict[int, dict]], methods: list[Method], pair: tuple[str, ...],
          runs_dir: Path) -> tuple[str, dict, dict]:
    """Markdown table of mean +- sd over seeds (final pass@1 per set, final and best average,
    all-fail and exchange rates, gate admission by advantage sign, peer clip fraction); returns
    it, {(method, model): (mean, sd)} of the final average, and the per-seed values (JSON)."""
    first = next(iter(next(iter(results.values())).values()))
    sets = sorted(s for s in final_scores(first, pair[0]) if s != "avg") + ["avg"]
    lines = ["| method | model | " + " | ".join(sets) + " | best avg | all-fail | exchange rate | "
             "admitted + / - | peer clip | push | peer grad | peer-only upd | recovery |",
             "|---|---|" + "---|" * (len(sets) + 9)]
    averages, per_seed = {}, {}
    for method in methods:
        runs = results.get(method.name, {})
        if not runs:
            continue
        for model in (m for m in method.models if m in pair):
            cells = []
            for s in sets:
                mean, sd = _mean_sd([final_scores(r, model)[s] for r in runs.values()])
                cells.append(f"{mean:.3f} ± {sd:.3f}")
                if s == "avg":
                    averages[(method.name, model)] = (mean, sd)
            best = _mean_sd([r["models"][model]["best_pass@1"].get("avg", np.nan) for r in runs.values()])
            means = {seed: {**run_means(run_dir(method, seed, runs_dir), model),
                            **train_pool_recovery(run_dir(method, seed, runs_dir), model, seed=seed)}
                     for seed in runs}
            keys = dict.fromkeys(k for m in means.values() for k in m)  # a seed without recovery lacks some
            col = {k: float(np.nanmean(vals)) if np.isfinite(vals).any() else float("nan")
                   for k in keys for vals in [np.array([m.get(k, np.nan) for m in means.values()], dtype=float)]}
            lines.append(f"| {method.name} | {model} | " + " | ".join(cells) + f" | {best[0]:.3f} ± {best[1]:.3f} | "
                         f"{col['all_fail']:.2f} | {col['exchange_rate']:.2f} | {col['admit_pos']:.2f} / "
                         f"{col['admit_neg']:.2f} | {col['peer_clip']:.2f} | {col['peer_push']:.2f} | "
                         f"{col['peer_grad']:.2f} | {col['peer_only_updates']:.2f} | {col['recovery']:.2f} |"
                         .replace("nan", "-"))
            per_seed.setdefault(method.name, {})[model] = {
                str(seed): {"final": r["models"][model]["final_pass@1"], "best": r["models"][model]["best_pass@1"],
                            "exchange": r["models"][model]["exchange"], **means[seed]}
                for seed, r in runs.items()}
    return "\n".join(lines), averages, per_seed


def complementarity_curve(store: Path, a: str, b: str) -> list[tuple[int, float]]:
    """Per step: among A's all-fail prompts, the fraction where B's own group has a success."""
    from dashboards.data import complementarity

    steps = sorted(int(p.stem.split("_")[1]) for p in store.glob("step_*.parquet"))
    curve = []
    for step in steps:
        matrix = complementarity(store, [a, b], step=step)
        if matrix is not None and matrix["C"][0][1] is not None:
            curve.append((step, matrix["C"][0][1]))
    return curve


def plot_table(averages: dict, methods: list[Method], pair: tuple[str, ...], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4.5))
    names = [m.name for m in methods if (m.name, pair[0]) in averages]
    x = np.arange(len(names))
    width = 0.38
    for i, model in enumerate(pair):
        means = [averages[(n, model)][0] for n in names]
        sds = [averages[(n, model)][1] for n in names]
        ax.bar(x + (i - 0.5) * width, means, width, yerr=sds, capsize=3, label=model)
    ax.set_xticks(x, names, rotation=25, ha="right")
    ax.set_ylabel("final pass@1, average of 5 eval sets")
    ax.set_title("Table 1 at laptop scale: mean ± sd over seeds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_task_curves(results: dict[str, dict[int, dict]], methods: list[Method], pair: tuple[str, ...],
                     runs_dir: Path, path: Path) -> None:
    """Per model, one panel per eval set: pass@1 over training (mean over seeds), one line per
    method; a model's weak tasks (those its warm start slips on) are marked in the title."""
    from benchmarks.learning_report import eval_curves, weak_tasks

    rows = [m for m in methods if results.get(m.name)]
    if not rows:
        return
    first = run_dir(rows[0], next(iter(results[rows[0].name])), runs_dir)
    weak = weak_tasks(first)
    sets = sorted(s for s in eval_curves(first, pair[0]) if s != "avg") + ["avg"]
    fig, axes = plt.subplots(len(pair), len(sets), figsize=(3.2 * len(sets), 2.9 * len(pair)), squeeze=False)
    for r, model in enumerate(pair):
        for c, name in enumerate(sets):
            ax = axes[r][c]
            for method in rows:
                per_seed = [dict(eval_curves(run_dir(method, seed, runs_dir), model).get(name, []))
                            for seed in results[method.name]]
                steps = sorted(set.intersection(*(set(curve) for curve in per_seed))) if per_seed else []
                if steps:
                    ax.plot(steps, [np.mean([curve[s] for curve in per_seed]) for s in steps], marker="o",
                            markersize=2.5, label=method.name)
            ax.set_title(f"{model}: {name}" + (" (weak)" if name in weak.get(model, []) else ""), fontsize=9,
                         color="firebrick" if name in weak.get(model, []) else "black")
            ax.set_ylim(-0.02, 1.02)
            ax.tick_params(labelsize=7)
    axes[0][-1].legend(fontsize=6, loc="upper left")
    fig.supxlabel("training step (0: the warm start)")
    fig.supylabel("held-out pass@1 (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_complementarity(curves: dict[str, list[list[tuple[int, float]]]], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, runs in curves.items():
        steps = sorted({s for run in runs for s, _ in run})
        mean = [np.mean([v for run in runs for s2, v in run if s2 == s]) for s in steps]
        ax.plot(steps, mean, marker="o", label=label)
    ax.set_xlabel("training step (GRPO n=8)")
    ax.set_ylabel("fraction of A's all-fail prompts B solves")
    ax.set_ylim(0, 1)
    ax.set_title("Complementarity over training (mean over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=None, help="RL steps of every run (default: the config's run.steps)")
    parser.add_argument("--methods", nargs="*", default=None, help="subset of method names")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--set", action="append", default=[], help="extra config override for every run")
    parser.add_argument("--pair-config", type=Path, default=PAIR, help="the pair regime (a config under configs/)")
    parser.add_argument("--pool-config", type=Path, default=POOL, help="the 3-model regime")
    parser.add_argument("--runs-subdir", default="runs",
                        help="the run folders' folder under --out (a committed results copy: run_data)")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: report the runs already in --out (another invocation may be training)")
    parser.add_argument("--quick", action="store_true",
                        help="one seed: the power check (GRPO n=8, n=32) and GRAFT (make bench-learning QUICK=1)")
    args = parser.parse_args(argv)
    args.set = ["run.eval_every=10", "run.eval_at_start=true", *args.set]
    if args.quick:
        args.seeds = args.seeds[:1]
        best, why = best_exchange(EXPERIMENTS)
        print(f"best exchange configuration: {why}", flush=True)
        args.methods = args.methods or ["GRPO n=8", "GRPO n=32", "GRAFT", *([best] if best else [])]

    import ray

    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from orchestrator.config import load_config
    from orchestrator.models import build_models

    methods = [m for m in METHODS if args.methods is None or m.name in args.methods]
    configs = {PAIR: args.pair_config, POOL: args.pool_config}
    # the regime's models first, one process per core: a run builds a missing model in its
    # driver, one model after the other (QUICK=1 from a fresh clone: 457 s for the pair's two)
    if not args.report_only:
        build_models([model for config in dict.fromkeys(configs[m.config] for m in methods)
                      for model in load_config(config, args.set).models], jobs=os.cpu_count() or 1,
                     report=lambda line: print(line, flush=True))
        ray.init(**local_ray_init_kwargs(num_cpus=8), log_to_driver=False)  # one instance for every run
    power_rows = [m for m in methods if m.name in ("GRPO n=8", "GRPO n=32")]
    methods = power_rows + [m for m in methods if m not in power_rows]  # the power check first
    runs_dir = args.out / args.runs_subdir
    results: dict[str, dict[int, dict]] = {}
    trained = 0
    start = time.perf_counter()
    power = ""
    for method, seed in [(m, s) for m in power_rows for s in args.seeds] + \
            [(m, s) for s in args.seeds for m in methods if m not in power_rows]:
        if not power and method not in power_rows and len(power_rows) == 2 and _has_power_rows(results):
            power = _power(results, runs_dir)
            print(power, flush=True)
        t0 = time.perf_counter()
        if args.report_only and not (run_dir(method, seed, runs_dir) / "summary.json").is_file():
            continue
        summary, fresh = run_one(method, seed, args.steps, runs_dir, args.set, configs)
        trained += fresh
        results.setdefault(method.name, {})[seed] = summary
        print(f"[{time.perf_counter() - start:6.0f}s] {method.name} seed {seed}: "
              f"{time.perf_counter() - t0:.0f}s, avg pass@1 "
              + ", ".join(f"{m}={final_scores(summary, m)['avg']:.3f}" for m in method.models), flush=True)
    if ray.is_initialized():
        ray.shutdown()

    if not power and len(power_rows) == 2 and _has_power_rows(results):
        power = _power(results, runs_dir)
        print(power, flush=True)
    pair = METHODS[0].models
    markdown, averages, per_seed = table(results, methods, pair, runs_dir)
    curves: dict[str, list] = {}
    for seed in args.seeds:
        store = run_dir(METHODS[0], seed, runs_dir) / "trajectories"
        if store.is_dir():
            for a, b in ((pair[0], pair[1]), (pair[1], pair[0])):
                curves.setdefault(f"A={a}, B={b}", []).append(complementarity_curve(store, a, b))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_table(averages, methods, pair, args.out / "table1.png")
    plot_task_curves(results, methods, pair, runs_dir, args.out / "task_curves.png")
    if curves:
        plot_complementarity(curves, args.out / "complementarity.png")
    steps = args.steps if args.steps is not None else first_summary_steps(results)
    seeds = sorted({seed for runs in results.values() for seed in runs})  # the seeds that have runs
    header = (f"# Table 1 at laptop scale\n\nseeds {seeds} (each row: the seeds in table1.json), {steps} steps, final pass@1 "
              f"(eval.samples per prompt, temperature 0.6, top-p 0.95), mean ± sd over seeds.\n"
              f"Produced by `make bench-learning`: this invocation trained {trained} of "
              f"{sum(map(len, results.values()))} runs in {time.perf_counter() - start:.0f} s (the others were "
              f"read from earlier invocations' run folders).\n\n")
    scores = {method: {model: {seed: run["models"][model]["final_pass@1"]["avg"] for seed, run in runs.items()}
                       for model in pair if all(model in run["models"] for run in runs.values())}
              for method, runs in results.items()}
    paired = paired_text(scores, pair)
    (args.out / "table1.md").write_text(header + (power + "\n\n## Rows\n\n" if power else "") + markdown + "\n"
                                        + (f"\n{paired}\n" if paired else ""))
    (args.out / "table1.json").write_text(json.dumps({"seeds": seeds, "steps": steps, "power": power,
                                                      "rows": per_seed}, indent=1))
    print(header + markdown + (f"\n\n{paired}" if paired else ""))
    return 0


def best_exchange(table_json: Path, min_seeds: int = 2) -> tuple[str | None, str]:
    """The exchange row of a committed ``table1.json`` with the highest final average pass@1
    (mean over its seeds, then over the pair's models), among rows that train peer data (not the
    GRPO rows nor the gate-closed control) and have at least ``min_seeds`` seeds; and a line that
    says why."""
    if not table_json.is_file():
        return None, f"no committed experiments at {table_json}"
    rows = json.loads(table_json.read_text())["rows"]
    known = {m.name for m in METHODS}
    scores = {}
    for name, per_model in rows.items():
        if name not in known or name.startswith("GRPO") or "gate closed" in name or name.startswith("pool"):
            continue
        seeds = [len(per_seed) for per_seed in per_model.values()]
        if min(seeds) < min_seeds:
            continue
        scores[name] = float(np.mean([np.mean([run["final"]["avg"] for run in per_seed.values()])
                                      for per_seed in per_model.values()]))
    if not scores:
        return None, f"no exchange row of {table_json} has {min_seeds} seeds"
    best = max(scores, key=scores.get)
    ranked = ", ".join(f"{name} {score:.3f}" for name, score in sorted(scores.items(), key=lambda kv: -kv[1]))
    return best, f"{best} (mean final avg pass@1 over seeds and models in {table_json.name}: {ranked})"


def first_summary_steps(results: dict[str, dict[int, dict]]) -> int:
    """The RL steps of the runs (every run of an invocation has the same)."""
    return next(iter(next(iter(results.values())).values()))["steps"]


def _has_power_rows(results: dict[str, dict[int, dict]]) -> bool:
    return bool(results.get("GRPO n=8")) and bool(results.get("GRPO n=32"))


def _power(results: dict[str, dict[int, dict]], runs_dir: Path) -> str:
    """The power check's report from the GRPO n=8 and n=32 runs (eval size from their config)."""
    from orchestrator.config import load_config

    n8 = next(m for m in METHODS if m.name == "GRPO n=8")
    config = load_config(run_dir(n8, next(iter(results[n8.name])), runs_dir) / "config.yaml")
    prompts = sum(min(e.size, config.eval.max_prompts or e.size) for e in config.data.eval)
    lines = power_check(results["GRPO n=8"], results["GRPO n=32"], n8.models, prompts, config.eval.samples)
    return power_text(lines)


if __name__ == "__main__":
    raise SystemExit(main())
