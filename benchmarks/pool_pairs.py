"""Each pool member's best pair, and the pool against it (issue #52's target, second part).

A pair row (``pair: <a> + <b> <row>``, ``benchmarks/learning_methods.py``) trains two models of
the pool's regime alone with a pair table's exchange. Pre-registered, as the configuration's
selection is: a member's **best pair** is the pair row holding it with the highest weak-task
pass@1 for that member averaged over the selection seeds, among the pair rows that have every
selection seed. The pool is then compared with each member's best pair on the seeds both have,
paired by seed (``benchmarks/paired_report.py``):

    d_s = pool(s) - best pair(s) for the member, paired t on the k shared seeds,
    Holm's correction over the members (one family: "is the pool at least each best pair").

The target is met for a member when mean d >= 0; the report gives the interval and the
Holm-corrected p either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from benchmarks.learning_methods import Method
from benchmarks.paired_report import PairedTest, SeedScores, dash_or, holm


def best_pairs(primary: SeedScores, pair_rows: Sequence[Method], seeds: Sequence[int]) -> dict[str, tuple[str, float]]:
    """member -> (its best pair row, that row's mean weak-task pass@1 for the member over ``seeds``),
    for every member of a pair row that has all ``seeds``."""
    best: dict[str, tuple[str, float]] = {}
    for row in pair_rows:
        for model in row.models:
            scores = primary.get(row.name, {}).get(model, {})
            if not all(s in scores for s in seeds):
                continue
            mean = float(np.mean([scores[s] for s in seeds]))
            if model not in best or mean > best[model][1]:
                best[model] = (row.name, mean)
    return best


def pool_vs_pairs_text(pool: str, primary: SeedScores, pairs: dict[str, tuple[str, float]],
                       seeds: Sequence[int], chosen_on: Sequence[int]) -> str:
    """The section: per member its best pair (chosen on ``chosen_on``) and the pool minus it on
    ``seeds`` (paired t, Holm over the members)."""
    members = [m for m in pairs if m in primary.get(pool, {})]
    tests = {}
    for model in members:
        own, pair = primary[pool][model], primary.get(pairs[model][0], {}).get(model, {})
        tests[model] = PairedTest(tuple(own[s] - pair[s] for s in seeds if s in own and s in pair))
    adjusted = dict(zip(members, holm([tests[m].p_t for m in members]), strict=True))
    out = [f"## {pool} against each member's best pair (weak-task pass@1, seeds {list(seeds)})", "",
           f"Best pair: the pair row with the member's highest weak-task pass@1 over the seeds {list(chosen_on)}.", "",
           "| member | best pair | its mean | seeds | pool - pair | 95% interval | paired t p | Holm p | per seed |",
           "|---|---|---|---|---|---|---|---|---|"]
    for model in members:
        t = tests[model]
        low, high = t.interval
        out.append(f"| {model} | {pairs[model][0]} | {pairs[model][1]:.3f} | {t.k} | {dash_or(t.mean, '+.3f')} | "
                   f"[{dash_or(low, '+.3f')}, {dash_or(high, '+.3f')}] | {dash_or(t.p_t, '.3f')} | {dash_or(adjusted[model], '.3f')} | "
                   f"{' '.join(f'{d:+.3f}' for d in t.diffs)} |")
    behind = [m for m in members if tests[m].k and tests[m].mean < 0]
    out += ["", "At least each best pair (mean difference >= 0) for every member: "
            + ("**yes**." if members and not behind else f"**no** ({', '.join(behind) or 'no member compared'}).")]
    return "\n".join(out)
