"""The premise check (issue #41): does the regime test GRAFT where its premise holds?

GRAFT's premise is a receiver that fails a prompt on every rollout and cannot learn it from its
own samples, and a peer that solves it. The check reads only the GRPO n=8 and n=32 runs (no
exchange row), per seed and model:

- the model's weak tasks: those its warm start slips on (``builder.sft_slips``);
- its weak-task pass@1 (the mean over those tasks' eval sets) under GRPO n=8 and n=32 at the
  horizon, and n=32's highest at any evaluation after step 0: **it cannot heal itself** when
  n=32's stays at or below ``NEAR_ZERO`` at every evaluation, on every seed;
- the donor's pass@1 on each of those tasks (the best other model of the pair, in the same
  GRPO n=8 run) at step 0 and at the horizon: **the peer solves them** when, on each weak task,
  its step-0 pass@1 averaged over the seeds is at least ``DONOR_MIN``. The warm start is the same
  model on every seed; each seed's step-0 evaluation is another estimate of its skill (1,024
  samples a task, sd about 0.015 at 0.3), so the mean over seeds is the figure judged, and each
  seed's is shown.

It ends with the minimum detectable effect of the paired t on the seeds there are
(``benchmarks.paired_report.min_detectable_effect``) for the primary metric (weak-task pass@1)
and the secondary one (the 5-set average), from GRPO n=8's seed sd: sd_d = sqrt(2) x that sd,
the sd of a difference of two independent runs, an upper bound for rows that share a seed's
warm start, prompts and evaluation draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.learning_report import eval_curves, weak_tasks
from benchmarks.paired_report import min_detectable_effect

NEAR_ZERO = 0.05
DONOR_MIN = 0.3


def weak_score(scores: dict[str, float], tasks: list[str]) -> float:
    """The mean pass@1 over the eval sets named as ``tasks`` (NaN: none of them evaluated)."""
    values = [scores[t] for t in tasks if t in scores]
    return float(np.mean(values)) if values else float("nan")


@dataclass
class PremiseLine:
    """One model on one seed."""

    model: str
    seed: int
    weak: list[str]
    n8: float  # weak-task pass@1 at the horizon, GRPO n=8
    n32: float  # ... GRPO n=32
    n32_max: float  # n=32's highest weak-task pass@1 at any evaluation after step 0
    donor: str
    donor_start: dict[str, float]  # the donor's pass@1 on each weak task at step 0 (GRPO n=8 run)
    donor_end: float  # its weak-task pass@1 at the horizon

    @property
    def cannot_heal(self) -> bool:
        return self.n32_max <= NEAR_ZERO



def donor_means(lines: list[PremiseLine]) -> dict[tuple[str, str], float]:
    """(receiver, weak task) -> the donor's step-0 pass@1 on it, averaged over the seeds."""
    values: dict[tuple[str, str], list[float]] = {}
    for line in lines:
        for task, value in line.donor_start.items():
            values.setdefault((line.model, task), []).append(value)
    return {key: float(np.mean(v)) for key, v in values.items()}


def peer_solves(lines: list[PremiseLine]) -> bool:
    """Every weak task's donor at ``DONOR_MIN`` or more at step 0, averaged over the seeds."""
    means = donor_means(lines)
    return bool(means) and min(means.values()) >= DONOR_MIN


def _curve_scores(run: Path, model: str) -> dict[int, dict[str, float]]:
    """step -> eval set -> pass@1 of ``model`` in one run folder."""
    out: dict[int, dict[str, float]] = {}
    for name, points in eval_curves(run, model).items():
        for step, value in points:
            out.setdefault(step, {})[name] = value
    return out


def premise_lines(n8_runs: dict[int, Path], n32_runs: dict[int, Path]) -> list[PremiseLine]:
    """One line per seed both rows have and per model (run folders by seed)."""
    lines = []
    for seed in sorted(set(n8_runs) & set(n32_runs)):
        weak = weak_tasks(n8_runs[seed])
        curves8 = {m: _curve_scores(n8_runs[seed], m) for m in weak}
        for model, tasks in weak.items():
            if not tasks:
                continue
            curve8, curve32 = curves8[model], _curve_scores(n32_runs[seed], model)
            last8, last32 = max(curve8), max(curve32)
            donors = {m: curves8[m][min(curves8[m])] for m in weak if m != model}
            donor = max(donors, key=lambda m: weak_score(donors[m], tasks))
            lines.append(PremiseLine(
                model, seed, tasks, weak_score(curve8[last8], tasks), weak_score(curve32[last32], tasks),
                max(weak_score(scores, tasks) for step, scores in curve32.items() if step > 0),
                donor, {t: donors[donor][t] for t in tasks if t in donors[donor]},
                weak_score(curves8[donor][max(curves8[donor])], tasks)))
    return lines


def premise_text(lines: list[PremiseLine], n8_primary: dict[str, list[float]],
                 n8_average: dict[str, list[float]]) -> str:
    """The report's opening section: the per-seed table, the verdict and the minimum detectable
    effects (``n8_*``: GRPO n=8's per-seed values of each metric, by model)."""
    if not lines:
        return ""
    out = ["## Premise check: GRPO n=8 and n=32 only (no exchange row)", "",
           f"A receiver cannot heal itself when GRPO n=32's weak-task pass@1 stays at or below {NEAR_ZERO} at "
           f"every evaluation, on every seed; the peer solves its weak tasks when the donor's step-0 pass@1 on "
           f"each, averaged over the seeds, is at least {DONOR_MIN}.", "",
           "| seed | model | weak tasks | n=8 at horizon | n=32 at horizon | n=32 highest | cannot heal | donor | "
           "donor at step 0 | donor at horizon |", "|---|---|---|---|---|---|---|---|---|---|"]
    for line in lines:
        start = " ".join(f"{t} {v:.3f}" for t, v in line.donor_start.items())
        out.append(f"| {line.seed} | {line.model} | {', '.join(line.weak)} | {line.n8:.3f} | {line.n32:.3f} | "
                   f"{line.n32_max:.3f} | {'yes' if line.cannot_heal else 'no'} | {line.donor} | {start} | "
                   f"{line.donor_end:.3f} |")
    out += ["", "Donor's step-0 pass@1, mean over seeds: " + ", ".join(
        f"{task} (for {model}) {value:.3f}" for (model, task), value in donor_means(lines).items())]
    heal = all(line.cannot_heal for line in lines)
    solve = peer_solves(lines)
    seeds = sorted({line.seed for line in lines})
    verdict = "HOLDS" if heal and solve else "does NOT hold"
    why = [] if heal else [f"GRPO n=32 lifts a weak task above {NEAR_ZERO} on its own"]
    why += [] if solve else [f"a donor is below {DONOR_MIN} on a weak task at step 0 (mean over seeds)"]
    out += ["", f"**Verdict: the premise {verdict}** on seeds {seeds}" + (f" ({'; '.join(why)})." if why else ".")]
    out += ["", "Minimum detectable effect (paired t, two-sided 0.05, power 0.8, on "
            f"{len(seeds)} seeds; sd of a difference taken as sqrt(2) x GRPO n=8's seed sd):", ""]
    for model in n8_primary:
        parts = []
        for label, values in (("weak-task pass@1", n8_primary[model]), ("5-set average", n8_average.get(model, []))):
            sd = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
            mde = min_detectable_effect(np.sqrt(2) * sd, len(values))
            parts.append(f"{label}: n=8 seed sd {sd:.3f}, MDE {mde:.3f}")
        out.append(f"- {model}: " + "; ".join(parts))
    return "\n".join(out)
