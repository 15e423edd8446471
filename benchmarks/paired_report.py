"""Statistics that decide: each row against GRPO n=8 on the same seeds, the selection of the best
exchange configuration, and its confirmation on fresh seeds (issue #41).

Rows of the learning benchmark that share a seed share the warm start, the prompts and the
evaluation draws, so the per-seed difference removes most of the seed-to-seed spread. Per row,
model and metric, over the k seeds both rows have:

    d_s = row(s) - n8(s),   mean d = (1/k) sum_s d_s,   sd_d = sd_s(d_s)  (k - 1 in the denominator)
    95% interval: mean d +- t_{0.975, k-1} sd_d / sqrt(k)
    paired t = mean d / (sd_d / sqrt(k)), two-sided p from Student's t with k - 1 degrees of freedom
    Wilcoxon signed-rank: exact two-sided p over the 2^k' sign flips (k' non-zero d_s, mid-ranks
    for ties); with 5 seeds its smallest possible p is 2/32 = 0.0625
    d_z = mean d / sd_d: the effect in sd of the per-seed differences, the one sd unit used here

The p-values of the exchange configurations compared for one model and metric are corrected
together with Holm's step-down method (p_(i) sorted ascending, m of them:
adj_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))). The decision test is the paired t; the Wilcoxon
p is reported beside it as a check that needs no normality.

Pre-registered (before any exchange row ran): the primary metric is each receiver's weak-task
pass@1 at the horizon (the mean over the eval sets of the tasks its warm start slips on), the
5-set average the secondary one; the best configuration is the exchange configuration with the
highest primary metric, averaged over the regime's models (the pair's two; every model of a
``--config`` pool), on seeds 0-4; it alone is then run
on seeds 5-9 (with GRPO n=8 and n=32 there), and the confirmation is reported separately:
target met when on every confirmation seed each receiver's weak-task pass@1 is above GRPO
n=32's, and the 5-set average is above GRPO n=8's with Holm-corrected (over the models)
paired-t p < 0.05 for every model.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

BASELINE = "GRPO n=8"
CEILING = "GRPO n=32"
ALPHA = 0.05

# method -> model -> seed -> value of one metric
SeedScores = dict[str, dict[str, dict[int, float]]]


def wilcoxon_exact(diffs: Sequence[float]) -> float:
    """Exact two-sided p of the Wilcoxon signed-rank test: zero differences dropped, mid-ranks of
    |d| for ties, every one of the 2^k sign assignments enumerated (k <= 20). 1.0 with no non-zero
    difference."""
    d = np.asarray([x for x in diffs if x != 0], dtype=float)
    if d.size == 0:
        return 1.0
    if d.size > 20:
        raise ValueError(f"exact enumeration needs at most 20 non-zero differences, got {d.size}")
    ranks = stats.rankdata(np.abs(d))
    observed = ranks[d > 0].sum()
    center = ranks.sum() / 2
    extreme = abs(observed - center)
    sums = np.array([sum(r for r, sign in zip(ranks, signs, strict=True) if sign)
                     for signs in itertools.product((False, True), repeat=d.size)])
    return float(np.mean(np.abs(sums - center) >= extreme - 1e-12))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the given order (NaN stays NaN, not counted in m)."""
    p = np.asarray(pvalues, dtype=float)
    finite = np.flatnonzero(np.isfinite(p))
    out = np.full(p.shape, np.nan)
    order = finite[np.argsort(p[finite], kind="stable")]
    m, running = len(order), 0.0
    for i, index in enumerate(order):
        running = max(running, min(1.0, (m - i) * p[index]))
        out[index] = running
    return out.tolist()


@dataclass(frozen=True)
class PairedTest:
    """One row against the baseline on shared seeds (see the module docstring)."""

    diffs: tuple[float, ...]  # per seed, in seed order

    @property
    def k(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float:
        return float(np.mean(self.diffs))

    @property
    def sd(self) -> float:
        return float(np.std(self.diffs, ddof=1)) if self.k > 1 else float("nan")

    @property
    def interval(self) -> tuple[float, float]:
        if self.k < 2:
            return float("nan"), float("nan")
        half = stats.t.ppf(1 - ALPHA / 2, self.k - 1) * self.sd / np.sqrt(self.k)
        return self.mean - half, self.mean + half

    @property
    def t(self) -> float:
        if self.k < 2:
            return float("nan")
        if self.sd == 0:
            return float("inf") * np.sign(self.mean) if self.mean else float("nan")
        return self.mean / (self.sd / np.sqrt(self.k))

    @property
    def p_t(self) -> float:
        t = self.t
        if not np.isfinite(t):
            return 0.0 if np.isinf(t) else float("nan")
        return float(2 * stats.t.sf(abs(t), self.k - 1))

    @property
    def p_wilcoxon(self) -> float:
        return wilcoxon_exact(self.diffs) if self.k else float("nan")

    @property
    def d_z(self) -> float:
        return self.mean / self.sd if self.sd and np.isfinite(self.sd) else float("nan")


def min_detectable_effect(sd_diff: float, k: int, power: float = 0.8, alpha: float = ALPHA) -> float:
    """The smallest true mean difference a two-sided paired t test on ``k`` seeds detects with
    probability ``power`` at level ``alpha`` when the per-seed differences have sd ``sd_diff``:
    delta = d_z sd_diff, d_z solving P(|T| > t_crit | noncentrality d_z sqrt(k)) = power, T a
    noncentral t with k - 1 degrees of freedom."""
    if k < 2 or not np.isfinite(sd_diff):
        return float("nan")
    df, crit = k - 1, stats.t.ppf(1 - alpha / 2, k - 1)

    def achieved(d_z: float) -> float:
        nc = d_z * np.sqrt(k)
        return stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc)

    low, high = 0.0, 50.0
    for _ in range(100):  # bisection: power rises with d_z
        mid = (low + high) / 2
        low, high = (mid, high) if achieved(mid) < power else (low, mid)
    return high * sd_diff


@dataclass
class PairedLine:
    method: str
    model: str
    test: PairedTest
    p_holm: float = float("nan")  # over the exchange configurations of this model and metric
    vs_ceiling: float | None = None  # mean (row - GRPO n=32) on shared seeds


def is_exchange_configuration(method: str) -> bool:
    """The rows that train peer data: not the GRPO rows, not the gate-closed control. Which
    regime's rows compete is the report's choice (``learning_tables.regime_rows``): the pair's
    rows by default, every row when one ``--config`` runs them all (a pool's ``pool: ...`` rows)."""
    return not (method.startswith("GRPO") or "gate closed" in method)


def paired_lines(scores: SeedScores, models: Sequence[str], baseline: str = BASELINE) -> list[PairedLine]:
    """One line per row (other than the baseline) and model with a seed in common with the
    baseline; Holm's correction over the exchange configurations, per model."""
    lines = []
    for method, per_model in scores.items():
        if method == baseline:
            continue
        for model in (m for m in models if m in per_model):
            base = scores.get(baseline, {}).get(model, {})
            shared = sorted(set(per_model[model]) & set(base))
            if not shared:
                continue
            ceiling = scores.get(CEILING, {}).get(model, {})
            top = sorted(set(per_model[model]) & set(ceiling))
            vs_ceiling = (float(np.mean([per_model[model][s] - ceiling[s] for s in top]))
                          if top and method != CEILING else None)
            test = PairedTest(tuple(per_model[model][s] - base[s] for s in shared))
            lines.append(PairedLine(method, model, test, vs_ceiling=vs_ceiling))
    for model in models:
        family = [line for line in lines if line.model == model and is_exchange_configuration(line.method)]
        for line, adjusted in zip(family, holm([line.test.p_t for line in family]), strict=True):
            line.p_holm = adjusted
    return lines


def dash_or(value: float, spec: str) -> str:
    """``value`` formatted with ``spec``, or "-" where it is None or not finite."""
    return "-" if value is None or not np.isfinite(value) else format(value, spec)


def paired_table(scores: SeedScores, models: Sequence[str], metric: str) -> str:
    """The paired section for one metric: per row and model, over its seeds shared with GRPO n=8."""
    lines = paired_lines(scores, models)
    if not lines:
        return ""
    out = [f"### {metric}: paired by seed against {BASELINE}", "",
           "| method | model | seeds | row - n=8 | 95% interval | d_z | paired t p | Holm p | Wilcoxon p | "
           "higher | row - n=32 | per seed |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in lines:
        t = line.test
        low, high = t.interval
        higher = sum(d > 0 for d in t.diffs)
        per_seed = " ".join(f"{d:+.3f}" for d in t.diffs)
        out.append(f"| {line.method} | {line.model} | {t.k} | {t.mean:+.3f} | [{dash_or(low, '+.3f')}, {dash_or(high, '+.3f')}] | "
                   f"{dash_or(t.d_z, '+.1f')} | {dash_or(t.p_t, '.3f')} | {dash_or(line.p_holm, '.3f')} | {dash_or(t.p_wilcoxon, '.3f')} | "
                   f"{higher}/{t.k} | {dash_or(line.vs_ceiling, '+.3f')} | {per_seed} |")
    out += ["", "d_z: the mean difference in sd of the per-seed differences. Holm: over the exchange "
            "configurations of the model (the rows that train peer data). The decision test is the paired t."]
    return "\n".join(out)


def select_best(primary: SeedScores, models: Sequence[str], seeds: Sequence[int]) -> tuple[str | None, str]:
    """The pre-registered choice: the exchange configuration with the highest primary metric
    (weak-task pass@1 at the horizon) averaged over ``seeds`` and then over ``models``, among those
    that have every seed for every model; and the ranking it chose from."""
    means = {}
    for method, per_model in primary.items():
        if not is_exchange_configuration(method):
            continue
        if all(model in per_model and all(s in per_model[model] for s in seeds) for model in models):
            means[method] = float(np.mean([np.mean([per_model[m][s] for s in seeds]) for m in models]))
    if not means:
        return None, "no exchange configuration has every selection seed"
    ranked = sorted(means.items(), key=lambda kv: -kv[1])
    return ranked[0][0], ", ".join(f"{name} {value:.3f}" for name, value in ranked)


@dataclass
class Confirmation:
    """The best configuration on the confirmation seeds (see the module docstring)."""

    method: str
    seeds: list[int]
    weak_margin: dict[str, dict[int, float]]  # model -> seed -> weak(best) - weak(n=32)
    average: dict[str, PairedTest]  # model -> 5-set average vs GRPO n=8
    p_holm: dict[str, float]

    @property
    def above_ceiling_everywhere(self) -> bool:
        return all(len(m) == len(self.seeds) and all(v > 0 for v in m.values()) for m in self.weak_margin.values())

    @property
    def average_significant(self) -> bool:
        return all(np.isfinite(p) and p < ALPHA and self.average[m].mean > 0 for m, p in self.p_holm.items())

    @property
    def met(self) -> bool:
        return self.above_ceiling_everywhere and self.average_significant


def confirm(method: str, primary: SeedScores, average: SeedScores, models: Sequence[str],
            seeds: Sequence[int]) -> Confirmation:
    """The confirmation of ``method`` on ``seeds``: its weak-task pass@1 against GRPO n=32's per
    seed, and its 5-set average against GRPO n=8's (paired t, Holm over the models)."""
    margins, tests = {}, {}
    for model in models:
        own, ceiling = primary.get(method, {}).get(model, {}), primary.get(CEILING, {}).get(model, {})
        margins[model] = {s: own[s] - ceiling[s] for s in seeds if s in own and s in ceiling}
        row, base = average.get(method, {}).get(model, {}), average.get(BASELINE, {}).get(model, {})
        tests[model] = PairedTest(tuple(row[s] - base[s] for s in seeds if s in row and s in base))
    adjusted = holm([tests[m].p_t for m in models])
    return Confirmation(method, list(seeds), margins, tests, dict(zip(models, adjusted, strict=True)))


def confirmation_text(c: Confirmation) -> str:
    out = [f"## Confirmation on fresh seeds {c.seeds}: {c.method}", "",
           "| model | weak-task pass@1 - GRPO n=32, per seed | above n=32 on every seed | 5-set average - n=8 | "
           f"95% interval | paired t p | Holm p ({len(c.weak_margin)} models) |", "|---|---|---|---|---|---|---|"]
    for model, margins in c.weak_margin.items():
        t = c.average[model]
        low, high = t.interval
        every = len(margins) == len(c.seeds) and all(v > 0 for v in margins.values())
        out.append(f"| {model} | {' '.join(f'{v:+.3f}' for _, v in sorted(margins.items()))} | "
                   f"{'yes' if every else 'no'} | {dash_or(t.mean, '+.3f')} | [{dash_or(low, '+.3f')}, {dash_or(high, '+.3f')}] | "
                   f"{dash_or(t.p_t, '.3f')} | {dash_or(c.p_holm[model], '.3f')} |")
    verdict = "met" if c.met else "not met"
    reasons = []
    if not c.above_ceiling_everywhere:
        reasons.append("the weak tasks are not above GRPO n=32 on every seed for every receiver")
    if not c.average_significant:
        reasons.append("the 5-set average is not above GRPO n=8 with Holm p < 0.05 for every model")
    out += ["", f"**Target: {verdict}**" + (f" ({'; '.join(reasons)})." if reasons else ".")]
    return "\n".join(out)
