"""The paper's Table 1 at laptop scale (``make bench-learning``).

For one pair of tiny models with different architectures AND tokenizers (llama + char,
gpt2 + BPE; ``configs/demo_pair.yaml``) and several RL seeds, train with: GRPO n=8, 16
and 32, SGT, GRAFT, GRAFT from stored peer trajectories (each model's peer's own GRPO n=8
run of the same seed), GRAFT without the gate (w = 1), GRAFT peer-first, the transfer
ablations (success-only, pooled advantages, recentered advantages, group gate:
``workers/peer_transfer.py``), HACPO (``policies/hacpo.py``), and pool routing over 3
models (``configs/pool3.yaml``). Same prompts, steps and learning rate everywhere. Writes ``benchmarks/results/table1.md`` (mean +- sd of final pass@1 per eval
set and their average), ``table1.png`` and ``complementarity.png`` (the fraction of each
model's all-fail prompts its peer solves, over training, from the GRPO n=8 runs).

Runs are resumable: a run whose ``summary.json`` exists is read, not re-run.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PAIR = ROOT / "configs" / "demo_pair.yaml"
POOL = ROOT / "configs" / "pool3.yaml"
RESULTS = ROOT / "benchmarks" / "results"


@dataclass(frozen=True)
class Method:
    name: str
    config: Path
    overrides: tuple[str, ...] = ()
    stored_from: str | None = None  # a method whose run's store donates (GRAFT stored)
    models: tuple[str, ...] = field(default=("llama-char", "gpt2-bpe"))

    @property
    def slug(self) -> str:
        return self.name.lower().replace(" ", "-").replace("=", "").replace("(", "").replace(")", "")


METHODS = [
    Method("GRPO n=8", PAIR, ("exchange.name=none",)),
    Method("GRPO n=16", PAIR, ("exchange.name=none", "algorithm.n=16")),
    Method("GRPO n=32", PAIR, ("exchange.name=none", "algorithm.n=32")),
    Method("SGT", PAIR, ("exchange.name=sgt",)),
    Method("GRAFT", PAIR, ("exchange.name=graft",)),
    Method("GRAFT stored", PAIR, (), stored_from="GRPO n=8"),
    Method("GRAFT no gate", PAIR, ("exchange.name=graft", "algorithm.gate=false")),
    Method("GRAFT peer-first", PAIR, ("exchange.name=graft", "algorithm.peer_last=false")),
    Method("GRAFT success-only", PAIR, ("exchange.name=graft", "algorithm.peer_responses=success")),
    Method("GRAFT pooled adv", PAIR, ("exchange.name=graft", "algorithm.peer_advantages=pooled")),
    Method("GRAFT recentered", PAIR, ("exchange.name=graft", "algorithm.peer_advantages=recentered")),
    Method("GRAFT group gate", PAIR, ("exchange.name=graft", "algorithm.gate_scope=group")),
    Method("HACPO", PAIR, ("exchange.name=hacpo",)),
    Method("pool (3 models)", POOL, ("exchange.name=pool",),
           models=("llama-char", "gpt2-bpe", "qwen2-char")),
]


def run_dir(method: Method, seed: int, out: Path) -> Path:
    return out / f"{method.slug}-s{seed}"


def run_one(method: Method, seed: int, steps: int, out: Path, common: list[str]) -> tuple[dict, bool]:
    """The run's summary, and whether it was trained now (False: read from an earlier invocation)."""
    from orchestrator.config import load_config
    from orchestrator.loop import train

    folder = run_dir(method, seed, out)
    if (folder / "summary.json").is_file():
        return json.loads((folder / "summary.json").read_text()), False
    overrides = [*common, f"run.steps={steps}", f"run.seed={seed}", f"run.output_dir={out}",
                 f"run.name={folder.name}", *method.overrides]
    if method.stored_from:
        source = next(m for m in METHODS if m.name == method.stored_from)
        store = run_dir(source, seed, out) / "trajectories"
        overrides += ["exchange.name=stored",
                      f"exchange.params={{store: '{store}', peers: [{', '.join(method.models)}]}}"]
    return train(load_config(method.config, overrides)), True


def final_scores(summary: dict, model: str) -> dict[str, float]:
    return summary["models"][model]["final_pass@1"]


def table(results: dict[str, dict[int, dict]], methods: list[Method], pair: tuple[str, ...]) -> tuple[str, dict]:
    """Markdown table of mean +- sd over seeds; also returns {(method, model): (mean, sd)} of avg."""
    first = next(iter(next(iter(results.values())).values()))
    sets = sorted(s for s in final_scores(first, pair[0]) if s != "avg") + ["avg"]
    lines = ["| method | model | " + " | ".join(sets) + " | all-fail | exchange rate |",
             "|---|---|" + "---|" * (len(sets) + 2)]
    averages = {}
    for method in methods:
        runs = results.get(method.name, {})
        if not runs:
            continue
        for model in (m for m in method.models if m in pair):
            cells = []
            for s in sets:
                values = np.array([final_scores(r, model)[s] for r in runs.values()])
                cells.append(f"{values.mean():.3f} ± {values.std(ddof=1) if len(values) > 1 else 0:.3f}")
                if s == "avg":
                    averages[(method.name, model)] = (values.mean(), values.std(ddof=1) if len(values) > 1 else 0.0)
            ex = [r["models"][model]["exchange"] for r in runs.values()]
            all_fail = np.mean([e["all_fail"] / max(e["prompts"], 1) for e in ex])
            rate = np.mean([e["received"] / e["all_fail"] if e["all_fail"] else 0 for e in ex])
            lines.append(f"| {method.name} | {model} | " + " | ".join(cells) + f" | {all_fail:.2f} | {rate:.2f} |")
    return "\n".join(lines), averages


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
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--methods", nargs="*", default=None, help="subset of method names")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--set", action="append", default=[], help="extra config override for every run")
    args = parser.parse_args(argv)
    args.set = ["run.eval_every=10", *args.set]

    import ray

    from orchestrator.raylocal import local_ray_init_kwargs

    ray.init(**local_ray_init_kwargs(num_cpus=8), log_to_driver=False)  # one instance for every run
    methods = [m for m in METHODS if args.methods is None or m.name in args.methods]
    runs_dir = args.out / "runs"
    results: dict[str, dict[int, dict]] = {}
    trained = 0
    start = time.perf_counter()
    for seed in args.seeds:
        for method in methods:
            t0 = time.perf_counter()
            summary, fresh = run_one(method, seed, args.steps, runs_dir, args.set)
            trained += fresh
            results.setdefault(method.name, {})[seed] = summary
            print(f"[{time.perf_counter() - start:6.0f}s] {method.name} seed {seed}: "
                  f"{time.perf_counter() - t0:.0f}s, avg pass@1 "
                  + ", ".join(f"{m}={final_scores(summary, m)['avg']:.3f}" for m in method.models), flush=True)
    ray.shutdown()

    pair = METHODS[0].models
    markdown, averages = table(results, methods, pair)
    curves: dict[str, list] = {}
    for seed in args.seeds:
        store = run_dir(METHODS[0], seed, runs_dir) / "trajectories"
        if store.is_dir():
            for a, b in ((pair[0], pair[1]), (pair[1], pair[0])):
                curves.setdefault(f"A={a}, B={b}", []).append(complementarity_curve(store, a, b))
    args.out.mkdir(parents=True, exist_ok=True)
    plot_table(averages, methods, pair, args.out / "table1.png")
    if curves:
        plot_complementarity(curves, args.out / "complementarity.png")
    header = (f"# Table 1 at laptop scale\n\nseeds {args.seeds}, {args.steps} steps, final pass@1 "
              f"(eval.samples per prompt, temperature 0.6, top-p 0.95), mean ± sd over seeds.\n"
              f"Produced by `make bench-learning`: this invocation trained {trained} of "
              f"{sum(map(len, results.values()))} runs in {time.perf_counter() - start:.0f} s (the others were "
              f"read from earlier invocations' run folders).\n\n")
    (args.out / "table1.md").write_text(header + markdown + "\n")
    print(header + markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
