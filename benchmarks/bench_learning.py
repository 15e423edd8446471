"""The paper's Table 1 at laptop scale, in a regime where GRAFT's premise holds (``make bench-learning``).

One pair of tiny models with different architectures AND tokenizers (llama + char, gpt2 + BPE;
``configs/learning_premise.yaml``: each model's weak tasks slip on every warm-start solution, so
it cannot learn them from its own samples, and its peer solves them), trained with the rows of
``benchmarks/learning_methods.py`` over several seeds, in three stages (issue #41):

1. **The premise check** (``benchmarks/premise_check.py``): GRPO n=8 and n=32 run first, on every
   selection seed; the report opens with each receiver's weak-task pass@1 (n=8, n=32) and its
   donor's, per seed, and a minimum detectable effect. No exchange row runs unless the premise
   holds (``--ignore-premise`` overrides, and the report says so).
2. **Selection** on ``--seeds`` (default 0-4): the table's rows, each paired by seed against GRPO
   n=8 (``benchmarks/paired_report.py``: 95% interval, paired t and Wilcoxon p, Holm across the
   exchange configurations) on the primary metric (the receiver's weak-task pass@1 at the horizon)
   and the secondary one (the 5-set average); the best exchange configuration is chosen by the
   pre-registered rule and also run with ``algorithm.minibatch_split=groups``.
3. **Confirmation** on ``--confirm-seeds`` (default 5-9): the chosen configuration alone, with
   GRPO n=8 and n=32, reported separately.

``--quick`` (``make bench-learning QUICK=1``): seed 0, the premise rows and one exchange row (the
committed table's best configuration), no confirmation. ``--config`` puts every row on one regime,
with its models (the premise check of the 4-model pool: ``--config configs/learning_premise_pool.yaml
--methods "GRPO n=8" "GRPO n=32"``, docs/benchmarks.md). Runs are resumable: a run whose
``summary.json`` exists is read, not re-run, so invocations with one ``--out`` and different
``--seeds`` / ``--methods`` build one table. After each run the trajectory store's figures are
summarised into ``store_summary.json`` (``benchmarks/exchange_analysis.py``) and its metrics and
the gate's histograms into ``run_digest.json`` (``benchmarks/learning_report.py``), so results
copies keep no store.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.learning_methods import PREMISE_ROWS, TABLE, Method, method
from benchmarks.learning_tables import report

ROOT = Path(__file__).resolve().parent.parent
PAIR = ROOT / "configs" / "learning_premise.yaml"
POOL = ROOT / "configs" / "learning_premise_pool3.yaml"
RESULTS = ROOT / "benchmarks" / "results"
COMMITTED = RESULTS / "learning_premise" / "table1.json"
"""The committed premise-regime table: QUICK=1 runs its chosen configuration."""
SELECTION_SEEDS = [0, 1, 2, 3, 4]
CONFIRMATION_SEEDS = [5, 6, 7, 8, 9]


def run_dir(row: Method, seed: int, runs: Path) -> Path:
    return runs / f"{row.slug}-s{seed}"


def run_one(row: Method, seed: int, runs: Path, common: list[str], configs: dict[str, Path]) -> tuple[dict, bool]:
    """The run's summary, and whether it was trained now (False: read from an earlier invocation)."""
    from benchmarks.exchange_analysis import store_summary
    from benchmarks.learning_report import run_digest
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    folder = run_dir(row, seed, runs)
    if (folder / "summary.json").is_file():
        return json.loads((folder / "summary.json").read_text()), False
    overrides = [*common, f"run.seed={seed}", f"run.output_dir={runs}", f"run.name={folder.name}", *row.overrides]
    if row.stored_from:
        store = run_dir(method(row.stored_from), seed, runs) / "trajectories"
        overrides += ["exchange.name=stored", f"exchange.params={{store: '{store}', peers: [{', '.join(row.models)}]}}"]
    summary = train(load_config(configs[row.regime], overrides) if not row.members
                    else load_config(data=members_only(configs[row.regime], row.members), overrides=overrides))
    store_summary(folder)  # the store's figures, kept when the store is not
    run_digest(folder)  # the metrics' and the gate's digest, made while the raw files are there
    return summary, True


def members_only(config: Path, members: tuple[str, ...]) -> dict:
    """The regime ``config`` as data with only the models named ``members`` (a pair of a pool), in
    the config's order; a name it lacks is refused, naming its models (:func:`keep_models`)."""
    from orchestrator.config.loading import _yaml

    return keep_models(_yaml(config.read_text()), members, config.name)


def keep_models(data: dict, members: tuple[str, ...], source: str) -> dict:
    """Config ``data`` with only the models named ``members``, in its order; a name it lacks stops
    the benchmark, naming ``source``'s models."""
    names = [m["name"] for m in data["models"]]
    if unknown := [m for m in members if m not in names]:
        raise SystemExit(f"{', '.join(unknown)}: not a model of {source} (its models: {', '.join(names)})")
    return {**data, "models": [m for m in data["models"] if m["name"] in members]}


def regime_rows(rows: list[Method], config: Path) -> list[Method]:
    """``rows`` on the regime ``config`` (``--config``): each names that config's models, not the
    pair's (a row of some of them, ``members``, keeps those)."""
    from orchestrator.config import load_config

    models = tuple(model.name for model in load_config(config).models)
    return [replace(row, models=tuple(m for m in models if m in row.members) if row.members else models)
            for row in rows]


def premise_holds(runs: Path, premise: list[Method], seeds: list[int]) -> tuple[bool, str]:
    """The premise check's verdict on ``seeds`` from the runs there are, and its report section.
    ``premise``: the GRPO n=8 and n=32 rows as this invocation runs them (on ``--config``, with
    that regime's models)."""
    from benchmarks.learning_tables import seed_scores
    from benchmarks.premise_check import premise_lines, premise_text, premise_verdict

    n8, n32 = (next(r for r in premise if r.name == name) for name in PREMISE_ROWS)
    lines = premise_lines({s: run_dir(n8, s, runs) for s in seeds}, {s: run_dir(n32, s, runs) for s in seeds})
    primary, average = seed_scores(runs, [n8], seeds)
    text = premise_text(lines, {m: list(v.values()) for m, v in primary.get(n8.name, {}).items()},
                        {m: list(v.values()) for m, v in average.get(n8.name, {}).items()})
    return premise_verdict(lines)[0], text


def committed_choice(table_json: Path) -> tuple[str | None, str]:
    """The chosen configuration of a committed premise-regime ``table1.json``, and why."""
    if not table_json.is_file():
        return None, f"no committed table at {table_json}"
    chosen = json.loads(table_json.read_text()).get("selection", {})
    if not chosen.get("best"):
        return None, f"{table_json} chose no configuration"
    return chosen["best"], f"{chosen['best']} (chosen in {table_json.relative_to(ROOT)}: {chosen['ranking']})"


class Bench:
    """One invocation: trains the rows not yet run, one at a time, with progress lines."""

    def __init__(self, args: argparse.Namespace):
        self.args, self.runs = args, args.out / args.runs_subdir
        self.configs = {"pair": args.pair_config, "pool": args.pool_config}
        self.trained, self.start = 0, time.perf_counter()

    def run(self, rows: list[Method], seeds: list[int]) -> None:
        todo = [(r, s) for s in seeds for r in rows]
        for i, (row, seed) in enumerate(todo):
            if self.args.report_only:
                continue
            t0 = time.perf_counter()
            summary, fresh = run_one(row, seed, self.runs, self.args.set, self.configs)
            self.trained += fresh
            scores = ", ".join(f"{m}={summary['models'][m]['final_pass@1']['avg']:.3f}" for m in row.models)
            print(f"[{time.perf_counter() - self.start:6.0f}s] ({i + 1}/{len(todo)}) {row.name} seed {seed}: "
                  f"{'trained in' if fresh else 'read,'} {time.perf_counter() - t0:.0f}s, avg pass@1 {scores}",
                  flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=SELECTION_SEEDS, help="selection seeds")
    parser.add_argument("--confirm-seeds", type=int, nargs="*", default=CONFIRMATION_SEEDS,
                        help="confirmation seeds (none: no confirmation)")
    parser.add_argument("--methods", nargs="*", default=None, help="rows to run (default: the table)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-learning",
                        help="where the runs and the report go (committed copies: benchmarks/results/)")
    parser.add_argument("--set", action="append", default=[], help="extra config override for every run")
    parser.add_argument("--pair-config", type=Path, default=PAIR, help="the pair regime")
    parser.add_argument("--pool-config", type=Path, default=POOL, help="the 3-model regime")
    parser.add_argument("--config", type=Path, default=None,
                        help="one regime for every row, with its models (in place of --pair-config and --pool-config)")
    parser.add_argument("--runs-subdir", default="runs", help="the run folders' folder under --out")
    parser.add_argument("--report-only", action="store_true", help="train nothing: report the runs in --out")
    parser.add_argument("--ignore-premise", action="store_true", help="run the exchange rows even if the premise fails")
    parser.add_argument("--quick", action="store_true",
                        help="seed 0: the premise rows and one exchange row (make bench-learning QUICK=1)")
    args = parser.parse_args(argv)
    args.set = ["run.eval_every=10", "run.eval_at_start=true", *args.set]
    if args.config:
        args.pair_config = args.pool_config = args.config
    chosen = None
    if args.quick:
        args.seeds, args.confirm_seeds = args.seeds[:1], []
        chosen, why = committed_choice(COMMITTED)
        print(f"exchange row: {why if chosen else 'GRAFT (' + why + ')'}", flush=True)
        args.methods = [*PREMISE_ROWS, chosen or "GRAFT"]
    names = list(args.methods if args.methods is not None else TABLE)
    rows = [method(n) for n in dict.fromkeys([*[n for n in PREMISE_ROWS if n in names], *names])]
    rows = regime_rows(rows, args.config) if args.config else rows
    bench = Bench(args)
    if not args.report_only:
        _start(args, rows)

    premise = [r for r in rows if r.name in PREMISE_ROWS]
    bench.run(premise, args.seeds)
    holds, premise_section = premise_holds(bench.runs, premise, args.seeds) if len(premise) == 2 else (True, "")
    if premise_section:
        print(premise_section, flush=True)
    exchange_rows = [r for r in rows if r not in premise]
    if not holds and not args.ignore_premise:
        print("The premise does not hold: no exchange row runs (--ignore-premise to run them anyway).", flush=True)
        exchange_rows = []
    bench.run(exchange_rows, args.seeds)
    text, selection = report(args, bench.runs, rows if holds or args.ignore_premise else premise, premise_section)
    if selection and args.methods is None and not args.quick:  # the chosen row cut by groups, then the confirmation
        best, n8, n32 = (method(name) for name in (selection, "GRPO n=8", "GRPO n=32"))
        best, n8, n32 = regime_rows([best, n8, n32], args.config) if args.config else (best, n8, n32)
        bench.run([best.with_split("groups")], args.seeds)
        bench.run([n8, n32, best], args.confirm_seeds)
        text, _ = report(args, bench.runs, [*rows, best.with_split("groups")], premise_section)
    _stop()
    print(f"{text}\n\nThis invocation trained {bench.trained} runs in {time.perf_counter() - bench.start:.0f} s.")
    return 0


def _start(args: argparse.Namespace, rows: list[Method]) -> None:
    """The regime's models built first, one process per core (a run builds a missing model in its
    driver, one model after the other), then one Ray instance for every run."""
    import ray

    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from orchestrator.config import load_config
    from orchestrator.models import build_models

    configs = {"pair": args.pair_config, "pool": args.pool_config}
    build_models([model for config in dict.fromkeys(configs[r.regime] for r in rows)
                  for model in load_config(config, args.set).models], jobs=os.cpu_count() or 1,
                 report=lambda line: print(line, flush=True))
    ray.init(**local_ray_init_kwargs(num_cpus=8), log_to_driver=False)


def _stop() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
