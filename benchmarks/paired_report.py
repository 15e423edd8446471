"""Each row against GRPO n=8 on the same seeds, and issue #28's first target judged from that.

Rows of the learning benchmark that share a seed share the warm start, the prompts and the
evaluation draws, so the per-seed difference removes most of the seed-to-seed spread. Per row
and model, over the seeds both rows have:

    d_s = avg_row(s) - avg_n8(s),   mean d = (1/k) sum_s d_s,   paired sd = sd_s(d_s)

and the mean is also read in units of GRPO n=8's own seed sd (over all its seeds), the unit of
the target: an exchange configuration **beats n=8 by more than 1 sd** for a model when
mean d > sd_s(avg_n8(s)), and **reaches n=16** for a model when its mean over the seeds it
shares with GRPO n=16 is at least n=16's mean there. The target (issue #28) asks both models
above n=8 by more than 1 sd and n=16 reached on at least one, judged on at least 5 seeds.
Exchange configurations are the rows that train peer data: not the GRPO rows, not the
gate-closed control, not the 3-model pool (another regime).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BASELINE = "GRPO n=8"
REFERENCE = "GRPO n=16"
TARGET_SEEDS = 5

# method -> model -> seed -> final average pass@1
SeedScores = dict[str, dict[str, dict[int, float]]]


@dataclass
class PairedLine:
    method: str
    model: str
    diffs: dict[int, float]  # seed -> row - GRPO n=8
    baseline_sd: float  # GRPO n=8's seed sd, all its seeds
    vs_reference: float | None  # mean (row - GRPO n=16) over shared seeds; None without shared seeds

    @property
    def mean(self) -> float:
        return float(np.mean(list(self.diffs.values())))

    @property
    def paired_sd(self) -> float:
        return float(np.std(list(self.diffs.values()), ddof=1)) if len(self.diffs) > 1 else float("nan")

    @property
    def in_baseline_sds(self) -> float:
        return self.mean / self.baseline_sd if self.baseline_sd > 0 else float("nan")

    @property
    def beats_baseline(self) -> bool:
        return self.baseline_sd > 0 and self.mean > self.baseline_sd

    @property
    def reaches_reference(self) -> bool:
        return self.vs_reference is not None and self.vs_reference >= -1e-9  # a tie up to float rounding


def is_exchange_configuration(method: str) -> bool:
    return not (method.startswith("GRPO") or "gate closed" in method or method.startswith("pool"))


def paired_lines(scores: SeedScores, models: tuple[str, ...]) -> list[PairedLine]:
    """One line per row (other than GRPO n=8) and model of ``models`` with a seed in common with n=8."""
    lines = []
    for method, per_model in scores.items():
        if method == BASELINE:
            continue
        for model in (m for m in models if m in per_model):
            base = scores.get(BASELINE, {}).get(model, {})
            shared = sorted(set(per_model[model]) & set(base))
            if not shared:
                continue
            reference = scores.get(REFERENCE, {}).get(model, {})
            ref_shared = sorted(set(per_model[model]) & set(reference))
            vs_reference = (float(np.mean([per_model[model][s] - reference[s] for s in ref_shared]))
                            if ref_shared and method != REFERENCE else None)
            base_sd = float(np.std(list(base.values()), ddof=1)) if len(base) > 1 else float("nan")
            lines.append(PairedLine(method, model, {s: per_model[model][s] - base[s] for s in shared},
                                    base_sd, vs_reference))
    return lines


def target_verdict(lines: list[PairedLine], models: tuple[str, ...], min_seeds: int = TARGET_SEEDS) -> str:
    """Whether an exchange configuration with ``min_seeds`` seeds meets the target; else the closest."""
    by_method: dict[str, dict[str, PairedLine]] = {}
    for line in lines:
        if is_exchange_configuration(line.method) and len(line.diffs) >= min_seeds:
            by_method.setdefault(line.method, {})[line.model] = line
    candidates = {m: per for m, per in by_method.items() if all(model in per for model in models)}
    if not candidates:
        return f"**Target: not judged**: no exchange configuration has {min_seeds} seeds on every model."
    met = [m for m, per in candidates.items()
           if all(per[model].beats_baseline for model in models)
           and any(per[model].reaches_reference for model in models)]
    if met:
        return "**Target: met** by " + ", ".join(met) + "."
    closest = max(candidates, key=lambda m: min(candidates[m][model].in_baseline_sds for model in models))
    parts = [f"{model} {line.mean:+.3f} ({line.in_baseline_sds:+.1f} n=8 sd"
             + (f", {line.vs_reference:+.3f} vs n=16" if line.vs_reference is not None else "") + ")"
             for model, line in candidates[closest].items()]
    return (f"**Target: not met** by any of the {len(candidates)} exchange configurations with {min_seeds}+ "
            f"seeds. Closest (the highest of its models' lower gain in n=8 sds): {closest}: " + "; ".join(parts) + ".")


def paired_text(scores: SeedScores, models: tuple[str, ...]) -> str:
    """The report's section: the paired table, then the target's verdict."""
    lines = paired_lines(scores, models)
    if not lines:
        return ""
    out = [f"## Paired by seed against {BASELINE}", "",
           f"Per row and model, over the seeds it shares with {BASELINE}: the mean of the per-seed "
           f"differences, their sd, the mean in units of {BASELINE}'s seed sd, the seeds on which the row "
           f"is higher, the mean difference to {REFERENCE} on shared seeds, and each seed's difference.", "",
           "| method | model | seeds | row - n=8 | paired sd | in n=8 sds | higher | row - n=16 | per seed |",
           "|---|---|---|---|---|---|---|---|---|"]
    for line in lines:
        higher = sum(d > 0 for d in line.diffs.values())
        ref = f"{line.vs_reference:+.3f}" if line.vs_reference is not None else "-"
        per_seed = " ".join(f"{d:+.3f}" for _, d in sorted(line.diffs.items()))
        out.append(f"| {line.method} | {line.model} | {len(line.diffs)} | {line.mean:+.3f} | {line.paired_sd:.3f} | "
                   f"{line.in_baseline_sds:+.1f} | {higher}/{len(line.diffs)} | {ref} | {per_seed} |"
                   .replace("nan", "-"))
    out += ["", target_verdict(lines, models)]
    return "\n".join(out)
