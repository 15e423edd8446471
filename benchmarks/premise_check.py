"""The premise check (issue #41): does the regime test GRAFT where its premise holds?

GRAFT's premise is a receiver that fails a prompt on every rollout and cannot learn it from its
own samples, and a peer that solves it. The check reads only the GRPO n=8 and n=32 runs (no
exchange row), per seed and model:

- the model's weak tasks: those its warm start slips on (``builder.sft_slips``);
- its weak-task pass@1 (the mean over those tasks' eval sets) under GRPO n=8 and n=32 at the
  horizon, and n=32's highest at any evaluation after step 0: **it cannot heal itself** when
  n=32's stays at or below ``NEAR_ZERO`` at every evaluation, on every seed;
- every peer's pass@1 on each of those tasks (the other models of the regime, in the same GRPO
  n=8 run) at step 0 and at the horizon. A peer is a **donor** of a weak task when its step-0
  pass@1 there, averaged over the seeds, is at least ``DONOR_MIN``; **a peer solves them** when
  each weak task has a donor. The warm start is the same model on every seed; each seed's step-0
  evaluation is another estimate of its skill (1,024 samples a task, sd about 0.015 at 0.3), so
  the mean over seeds is the figure judged, and each seed's is shown. The table's ``donor`` is the
  peer with the highest step-0 pass@1 averaged over the receiver's weak tasks (a pair's one peer);
- in a pool (more than one peer), **each receiver needs more than one donor**: no single peer is
  a donor of every weak task of a receiver (``configs/learning_premise_pool.yaml``, issue #52).

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
    peers_start: dict[str, dict[str, float]]  # peer -> its pass@1 on each weak task at step 0 (GRPO n=8 run)
    peers_end: dict[str, float]  # peer -> its weak-task pass@1 at the horizon

    @property
    def cannot_heal(self) -> bool:
        return self.n32_max <= NEAR_ZERO

    @property
    def donor(self) -> str:
        """The peer with the highest step-0 pass@1 averaged over the weak tasks (the first on a tie)."""
        return max(self.peers_start, key=lambda m: weak_score(self.peers_start[m], self.weak))

    @property
    def donor_start(self) -> dict[str, float]:
        return self.peers_start[self.donor]

    @property
    def donor_end(self) -> float:
        return self.peers_end[self.donor]


def peer_means(lines: list[PremiseLine]) -> dict[tuple[str, str], dict[str, float]]:
    """(receiver, weak task) -> peer -> its step-0 pass@1 on the task, averaged over the seeds."""
    values: dict[tuple[str, str], dict[str, list[float]]] = {}
    for line in lines:
        for peer, scores in line.peers_start.items():
            for task, value in scores.items():
                values.setdefault((line.model, task), {}).setdefault(peer, []).append(value)
    return {key: {peer: float(np.mean(v)) for peer, v in by_peer.items()} for key, by_peer in values.items()}


def donor_means(lines: list[PremiseLine]) -> dict[tuple[str, str], float]:
    """(receiver, weak task) -> the best peer's step-0 pass@1 on it, averaged over the seeds."""
    return {key: max(by_peer.values()) for key, by_peer in peer_means(lines).items()}


def task_donors(lines: list[PremiseLine]) -> dict[tuple[str, str], list[str]]:
    """(receiver, weak task) -> its donors: the peers at ``DONOR_MIN`` or more at step 0, averaged
    over the seeds."""
    return {key: [peer for peer, mean in by_peer.items() if mean >= DONOR_MIN]
            for key, by_peer in peer_means(lines).items()}


def peer_solves(lines: list[PremiseLine]) -> bool:
    """Every weak task has a donor (a peer at ``DONOR_MIN`` or more at step 0, averaged over the seeds)."""
    donors = task_donors(lines)
    return bool(donors) and all(donors.values())


def single_donors(lines: list[PremiseLine]) -> dict[str, list[str]]:
    """Receiver -> the peers that are donors of every one of its weak tasks (in a pool none is
    wanted: each receiver then needs more than one donor)."""
    donors = task_donors(lines)
    return {line.model: [peer for peer in line.peers_start
                         if all(peer in donors.get((line.model, task), []) for task in line.weak)]
            for line in lines}


def is_pool(lines: list[PremiseLine]) -> bool:
    """More than one peer per receiver: the regime is a pool, not a pair."""
    return any(len(line.peers_start) > 1 for line in lines)


def premise_verdict(lines: list[PremiseLine]) -> tuple[bool, list[str]]:
    """Whether the premise holds on ``lines``, and each criterion it fails: every receiver cannot
    heal itself, every weak task has a donor, and in a pool no single peer donates all of a
    receiver's weak tasks."""
    why = [] if all(line.cannot_heal for line in lines) else [f"GRPO n=32 lifts a weak task above {NEAR_ZERO} on its own"]
    why += [] if peer_solves(lines) else [f"a donor is below {DONOR_MIN} on a weak task at step 0 (mean over seeds)"]
    if is_pool(lines):
        why += [f"one peer donates all of {model}'s weak tasks ({', '.join(peers)})"
                for model, peers in single_donors(lines).items() if peers]
    return bool(lines) and not why, why


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
            peers = [m for m in weak if m != model]
            starts = {m: curves8[m][min(curves8[m])] for m in peers}
            lines.append(PremiseLine(
                model, seed, tasks, weak_score(curve8[last8], tasks), weak_score(curve32[last32], tasks),
                max(weak_score(scores, tasks) for step, scores in curve32.items() if step > 0),
                {m: {t: starts[m][t] for t in tasks if t in starts[m]} for m in peers},
                {m: weak_score(curves8[m][max(curves8[m])], tasks) for m in peers}))
    return lines


def donors_table(lines: list[PremiseLine]) -> str:
    """A pool's donors: per receiver and weak task, every peer's step-0 pass@1 (mean over seeds)
    and the donors among them; per receiver, whether one peer donates all its weak tasks."""
    means, donors, single = peer_means(lines), task_donors(lines), single_donors(lines)
    out = [f"Donors per weak task (a peer at {DONOR_MIN} or more at step 0, mean over seeds); a pool's receiver "
           "needs more than one donor: no single peer may donate all of its weak tasks.", "",
           "| receiver | weak task | donors | every peer at step 0 | one peer donates all |", "|---|---|---|---|---|"]
    for (model, task), by_peer in means.items():
        peers = " ".join(f"{peer} {value:.3f}" for peer, value in by_peer.items())
        out.append(f"| {model} | {task} | {', '.join(donors[model, task]) or 'none'} | {peers} | "
                   f"{', '.join(single[model]) or 'no'} |")
    return "\n".join(out)


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
    if is_pool(lines):
        out += ["", donors_table(lines)]
    holds, why = premise_verdict(lines)
    seeds = sorted({line.seed for line in lines})
    verdict = "HOLDS" if holds else "does NOT hold"
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
