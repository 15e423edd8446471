"""The learning benchmark's report (``table1.md``, ``table1.json`` and the plots) from its run
folders: the premise check, the rows, the paired statistics on the selection seeds, the
pre-registered choice and the confirmation on fresh seeds (``benchmarks/bench_learning.py``)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks.learning_methods import PAIR_MODELS, Method
from benchmarks.learning_report import run_means, weak_tasks
from benchmarks.paired_report import (
    SeedScores,
    confirm,
    confirmation_text,
    paired_table,
    select_best,
)
from benchmarks.pool_pairs import best_pairs, pool_vs_pairs_text
from benchmarks.premise_check import weak_score


def _run(row: Method, seed: int, runs: Path) -> Path:
    return runs / f"{row.slug}-s{seed}"


def _summary(row: Method, seed: int, runs: Path) -> dict | None:
    path = _run(row, seed, runs) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def compared_rows(args: argparse.Namespace, rows: list[Method]) -> list[Method]:
    """The rows the paired statistics and the selection compare, all on one regime: with one
    ``--config`` for every row (``pair_config`` is ``pool_config``) every row; else the pair's rows
    (the default 3-model pool is another regime, its models not the pair's)."""
    return list(rows) if args.pair_config == args.pool_config else [r for r in rows if r.regime == "pair"]


def seed_scores(runs: Path, rows: list[Method], seeds: list[int]) -> tuple[SeedScores, SeedScores]:
    """(primary, secondary) per row, model and seed: the model's weak-task pass@1 at the horizon
    (the mean over the eval sets of the tasks its warm start slips on) and the 5-set average."""
    primary: SeedScores = {}
    average: SeedScores = {}
    for row in rows:
        for seed in seeds:
            summary = _summary(row, seed, runs)
            if summary is None:
                continue
            weak = weak_tasks(_run(row, seed, runs))
            for model in row.models:
                final = summary["models"][model]["final_pass@1"]
                primary.setdefault(row.name, {}).setdefault(model, {})[seed] = weak_score(final, weak.get(model, []))
                average.setdefault(row.name, {}).setdefault(model, {})[seed] = final["avg"]
    return primary, average


def _cell(values: list[float]) -> str:
    finite = [v for v in values if np.isfinite(v)]
    if not finite:
        return "-"
    return f"{np.mean(finite):.3f} ± {np.std(finite, ddof=1):.3f}" if len(finite) > 1 else f"{finite[0]:.3f}"


def _mean(values: list[float], digits: int = 2) -> str:
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return f"{np.mean(finite):.{digits}f}" if finite else "-"


def rows_table(runs: Path, rows: list[Method], seeds: list[int]) -> tuple[str, dict]:
    """Mean ± sd over ``seeds`` per row and model, and the per-seed values (for table1.json)."""
    sets: list[str] = []
    per_seed: dict = {}
    lines = []
    for row in rows:
        found = {s: summary for s in seeds if (summary := _summary(row, s, runs)) is not None}
        if not found:
            continue
        for model in row.models:
            finals = {s: found[s]["models"][model]["final_pass@1"] for s in found}
            sets = sets or sorted(k for k in next(iter(finals.values())) if k != "avg")
            weak = {s: weak_tasks(_run(row, s, runs)).get(model, []) for s in found}
            means = {s: run_means(_run(row, s, runs), model) for s in found}
            primary = [weak_score(finals[s], weak[s]) for s in found]
            lines.append(
                f"| {row.name} | {model} | {len(found)} | {_cell(primary)} | {_cell([f['avg'] for f in finals.values()])} | "
                + " | ".join(_cell([f.get(name, np.nan) for f in finals.values()]) for name in sets)
                + f" | {_mean([m['updates'] for m in means.values()])} | {_mean([m['all_fail'] for m in means.values()])} | "
                f"{_mean([m['exchange_rate'] for m in means.values()])} | {_mean([m['admit_pos'] for m in means.values()])} / "
                f"{_mean([m['admit_neg'] for m in means.values()])} | {_mean([m['peer_clip'] for m in means.values()], 4)} | "
                f"{_mean([m['peer_push'] for m in means.values()])} | {_mean([m['peer_only_updates'] for m in means.values()])} |")
            per_seed.setdefault(row.name, {})[model] = {
                str(s): {"final": finals[s], "weak": weak_score(finals[s], weak[s]), "weak_tasks": weak[s],
                         "best": found[s]["models"][model]["best_pass@1"], **means[s]} for s in found}
    header = ["| row | model | seeds | weak-task pass@1 | 5-set avg | " + " | ".join(sets)
              + " | updates / step | all-fail | exchange rate | admitted correct / wrong | peer clip | push | "
              "peer-only upd |", "|---|---|---|---|---|" + "---|" * (len(sets) + 7)]
    return "\n".join(header + lines), per_seed


def report(args: argparse.Namespace, runs: Path, rows: list[Method], premise_section: str) -> tuple[str, str | None]:
    """Write ``table1.md``, ``table1.json`` and the plots into ``args.out``; returns the text and
    the chosen configuration (None until every exchange configuration has every selection seed)."""
    from benchmarks.learning_plots import (
        plot_flows,
        plot_gate_by_task,
        plot_table,
        plot_task_curves,
    )

    seeds, confirm_seeds = list(args.seeds), list(args.confirm_seeds or [])
    primary, average = seed_scores(runs, rows, seeds)
    table, per_seed = rows_table(runs, rows, seeds)
    pair = compared_rows(args, rows)
    models = (tuple(dict.fromkeys(m for r in pair if not r.members for m in r.models))  # the regime's (--config)
              or tuple(dict.fromkeys(m for r in pair for m in r.models)) or PAIR_MODELS)
    names = {r.name for r in pair}
    whole = {r.name for r in pair if not r.members}  # a pair of the regime's models is not a configuration of it
    candidates = {name: v for name, v in primary.items() if "[" not in name and name in whole}  # own split each
    best, ranking = select_best(candidates, models, seeds)
    regime = "the premise regime" if args.pair_config.stem == "learning_premise" else args.pair_config.name
    sections = [f"# Table 1 in {regime}\n\nSelection seeds {seeds}, confirmation seeds {confirm_seeds}; "
                f"final held-out pass@1 (eval.samples per prompt, temperature 0.6, top-p 0.95) at the horizon. "
                f"Produced by `make bench-learning` ({args.pair_config.name}, {args.pool_config.name}).",
                premise_section, "## Rows (selection seeds)", table,
                "weak-task pass@1: the mean over the eval sets of the tasks the model's warm start slips on (the "
                "primary metric); updates / step: optimizer steps each step took; admitted correct / wrong: the "
                "gate's admission rate of the donor's correct and wrong responses.",
                "## Paired statistics (selection seeds)",
                paired_table({k: v for k, v in primary.items() if k in names}, models,
                             "Primary: weak-task pass@1 at the horizon"),
                paired_table({k: v for k, v in average.items() if k in names}, models,
                             "Secondary: 5-set average at the horizon"),
                f"## Selection\n\nThe pre-registered rule (highest primary metric over the seeds {seeds} and the "
                f"{len(models)} models, exchange configurations only): **{best or 'not yet: rows missing'}**. Ranking: {ranking}."]
    pair_rows = [r for r in pair if r.members]  # issue #52: each member's best pair (benchmarks/pool_pairs.py)
    chosen_pairs = best_pairs(primary, pair_rows, seeds) if best and pair_rows else {}
    if chosen_pairs:
        sections.append(pool_vs_pairs_text(best, primary, chosen_pairs, seeds, seeds))
    confirmation = None
    if best and confirm_seeds:
        from benchmarks.learning_methods import method

        chosen, n8, n32 = (replace(method(name), models=models) for name in (best, "GRPO n=8", "GRPO n=32"))
        c_primary, c_average = seed_scores(runs, [n8, n32, chosen], confirm_seeds)
        if best in c_primary and all(len(v) == len(confirm_seeds) for v in c_primary[best].values()):
            confirmation = confirm(best, c_primary, c_average, models, confirm_seeds)
            sections.append(confirmation_text(confirmation))
            confirm_table, confirm_seed_rows = rows_table(runs, [n8, n32, chosen], confirm_seeds)
            sections += ["### Confirmation rows", confirm_table]
            per_seed["confirmation"] = confirm_seed_rows
            pair_primary, _ = seed_scores(runs, [r for r in pair_rows if r.name in {p for p, _ in chosen_pairs.values()}],
                                          confirm_seeds)
            if pair_primary:
                sections.append(pool_vs_pairs_text(best, {**c_primary, **pair_primary}, chosen_pairs, confirm_seeds, seeds))
    text = "\n\n".join(s for s in sections if s)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table1.md").write_text(text + "\n")
    (args.out / "table1.json").write_text(json.dumps({
        "seeds": seeds, "confirm_seeds": confirm_seeds, "rows": per_seed,
        "selection": {"best": best, "ranking": ranking},
        "confirmation": None if confirmation is None else {
            "method": confirmation.method, "met": confirmation.met,
            "weak_margin": confirmation.weak_margin, "p_holm": confirmation.p_holm,
            "average_mean": {m: t.mean for m, t in confirmation.average.items()}}}, indent=1))
    plot_table(primary, average, pair, models, args.out / "table1.png")
    plot_task_curves(runs, pair, seeds, args.out / "task_curves.png")
    plot_flows(runs, rows, seeds, args.out / "flow.png")
    plot_gate_by_task(runs, rows, seeds, args.out / "gate_by_task.png")
    return text, best
