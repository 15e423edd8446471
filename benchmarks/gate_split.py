"""Which part of the gate's ln s tells a donor's right answers from its wrong ones (issue #53 part 2)?

Every ``graft`` row of a run's trajectory store (one donor response offered to a receiver, scored
under the receiver's pi_old whether or not the gate admitted it) holds Eq. 7's ln s split into
three parts (``workers.receiver.gate_split``, docs/algorithm.md "ln s split"):

    ln s = compat_answer + compat_rest + compat_eos

(the answer span from the final ``\\boxed{`` on, the reasoning before it, the EOS token; each side's
sum divided by its own token count; ``compat_eos`` NaN for a response cut at the budget, which
counts as 0 in the sum). Per run, receiver and task, for correct and for wrong donor responses
(reward above ``SUCCESS_THRESHOLD`` or not): the number of rows, the mean of each part and of
ln s, and the AUROC (correct vs wrong, ``benchmarks.gate_auroc.auroc``: P(score of a correct >
score of a wrong), ties 1/2) of each part alone and of ln s. ln s is the parts' sum, Eq. 7
whatever the run's ``exchange.gate_kind`` (its ``compat`` under ``token_mean``). Rows without
the split (NaN parts: a response that re-tokenised to nothing) are left out; ``compat_eos``
figures are over finished responses only (``n_eos``).

    python -m benchmarks.gate_split RUN_FOLDER [RUN_FOLDER ...] --out DIR   # -> gate_split.{md,json,png}
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.gate_auroc import auroc, run_folders
from graftpool.contracts import SUCCESS_THRESHOLD
from workers.receiver.gate_split import SPLIT_COLUMNS, split_sum

PARTS = ("answer", "rest", "eos", "log_s")
"""The scores per row: the three parts (``compat_<part>``) and their sum, ln s."""
COLUMNS = ["model", "task", "reward", "kind", *SPLIT_COLUMNS]


def row_parts(rows: list[dict]) -> list[dict]:
    """One dict per graft row with a split: receiver, task, correct, and each of :data:`PARTS`."""
    out = []
    for r in rows:
        if r["kind"] != "graft":
            continue
        parts = [float("nan") if r[name] is None else float(r[name]) for name in SPLIT_COLUMNS]
        if math.isnan(parts[0]) or math.isnan(parts[1]):
            continue
        out.append({"receiver": r["model"], "task": r["task"], "correct": r["reward"] > SUCCESS_THRESHOLD,
                    **dict(zip(PARTS[:3], parts, strict=True)), "log_s": split_sum(parts)})
    return out


def _mean(values: list[float]) -> float:
    x = [v for v in values if not math.isnan(v)]
    return float(np.mean(x)) if x else float("nan")


def summary(group: list[dict]) -> dict:
    """``n_correct``, ``n_wrong``, ``n_eos`` (finished ones, correct + wrong), and per part: its
    mean over the correct (``mean_correct``) and wrong (``mean_wrong``) rows and its ``auroc``."""
    right = [g for g in group if g["correct"]]
    wrong = [g for g in group if not g["correct"]]
    out: dict = {"n_correct": len(right), "n_wrong": len(wrong),
                 "n_eos": sum(not math.isnan(g["eos"]) for g in group)}
    for part in PARTS:
        out[part] = {"mean_correct": _mean([g[part] for g in right]), "mean_wrong": _mean([g[part] for g in wrong]),
                     "auroc": auroc([g[part] for g in right], [g[part] for g in wrong])}
    return out


def table(parts_by_run: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, dict]]]:
    """{run: {receiver: {task: :func:`summary`}}}."""
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for run, parts in parts_by_run.items():
        groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
        for p in parts:
            groups[(p["receiver"], p["task"])].append(p)
        out[run] = defaultdict(dict)
        for (receiver, task), group in sorted(groups.items()):
            out[run][receiver][task] = summary(group)
        out[run] = dict(out[run])
    return out


def _cell(x: float, digits: int = 3) -> str:
    return "-" if math.isnan(x) else f"{x:+.{digits}f}"


def markdown(result: dict[str, dict[str, dict[str, dict]]]) -> str:
    lines = ["ln s split into the answer span, the rest and EOS, correct vs wrong donor responses "
             f"(`benchmarks/gate_split.py`; runs: {', '.join(result)})", "",
             "Means per part, correct / wrong (nats per token, each side's sum over its own tokens); "
             "AUROC of correct vs wrong (0.5: chance; above: the part scores the right ones higher).", "",
             "| run | receiver | task | correct | wrong | finished | answer c / w | rest c / w | eos c / w "
             "| ln s c / w | AUROC answer | rest | eos | ln s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run, receivers in result.items():
        for receiver, tasks in receivers.items():
            for task, row in tasks.items():
                means = [f"{_cell(row[p]['mean_correct'])} / {_cell(row[p]['mean_wrong'])}" for p in PARTS]
                aurocs = ["-" if math.isnan(row[p]["auroc"]) else f"{row[p]['auroc']:.3f}" for p in PARTS]
                lines.append(f"| {run} | {receiver} | {task} | {row['n_correct']} | {row['n_wrong']} | "
                             f"{row['n_eos']} | " + " | ".join(means) + " | " + " | ".join(aurocs) + " |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, dict[str, dict[str, dict]]], path: Path) -> None:
    """AUROC per part (top) and the mean part of correct minus wrong responses (bottom), one group
    of bars per run, receiver and task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(f"{run}\n{receiver}\n{task}", row) for run, receivers in result.items()
            for receiver, tasks in receivers.items() for task, row in tasks.items()]
    x = np.arange(len(rows))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(7, 0.8 * len(rows)), 7), sharex=True)
    for i, part in enumerate(PARTS):
        offset = (i - 1.5) * 0.2
        top.bar(x + offset, [r[part]["auroc"] for _, r in rows], width=0.2, label=part)
        bottom.bar(x + offset, [r[part]["mean_correct"] - r[part]["mean_wrong"] for _, r in rows], width=0.2,
                   label=part)
    top.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    top.set_ylim(0, 1)
    top.set_ylabel("AUROC (correct vs wrong)")
    top.set_title("Which part of ln s tells a donor's right answers from its wrong ones?")
    top.legend(fontsize=7)
    bottom.axhline(0.0, color="grey", linewidth=0.8)
    bottom.set_ylabel("mean part: correct - wrong (nats)")
    bottom.set_xticks(x, [label for label, _ in rows], fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_store(run: Path) -> list[dict]:
    import pyarrow.dataset as ds

    return ds.dataset(str(run / "trajectories"), format="parquet").to_table(columns=COLUMNS).to_pylist()


def main() -> None:
    runs, out = run_folders(__doc__.split("\n\n")[0])
    result = table({run.name: row_parts(read_store(run)) for run in runs})
    (out / "gate_split.json").write_text(json.dumps({"runs": [str(r) for r in runs], "split": result},
                                                         indent=1) + "\n")
    (out / "gate_split.md").write_text(markdown(result))
    plot(result, out / "gate_split.png")
    print(markdown(result))


if __name__ == "__main__":
    main()
