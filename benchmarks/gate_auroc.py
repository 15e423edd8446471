"""How well does the compatibility gate tell a donor's right answers from its wrong ones (issue #53)?

For every ``graft`` row of the given runs' trajectory stores (one donor response offered to a
receiver, scored under the receiver's pi_old whether or not the gate then admitted it), a score
per gate variant; per receiver and task, the area under the ROC curve of each score for
correct-vs-wrong donor responses: AUROC = P(score of a correct > score of a wrong), ties 1/2
(the Mann-Whitney U / (n_correct * n_wrong)). 0.5: the gate cannot tell them apart; above 0.5
it prefers the right ones; below, the wrong ones.

Variants (``benchmarks.gate_histograms`` for the first two's formulas):

- ``per_token``: ln s = l_B - l_A, the paper's score (Eq. 7);
- ``per_byte``: (n_B l_B - n_A l_A) / bytes(response), tokenizer-invariant;
- ``self_calibrated``: l_B minus the mean of l over the receiver's own n responses to the same
  prompt (its own rows' ``mean_logp``, same step): the donor response's likelihood against what
  the receiver itself says on that prompt, with no term of the donor's model.

- ``answer_masked``: ln s over the reasoning tokens only (the answer span masked), from a run
  whose own gate scored it (``exchange.gate_kind: answer_masked``: its ``compat`` is that s);
  the three above need a ``token_mean`` run's ``compat`` and are left out of such a run.

The split of ln s into answer span, rest and EOS: ``benchmarks/gate_split.py``, from the store's
``compat_answer``, ``compat_rest`` and ``compat_eos`` (graft rows of the stores that have them).

    python -m benchmarks.gate_auroc RUN_FOLDER [RUN_FOLDER ...] --out DIR   # -> gate_auroc.{md,json,png}
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.gate_histograms import donor_lengths, graft_per_byte, log_s
from graftpool.contracts import SUCCESS_THRESHOLD

VARIANTS = ("per_token", "per_byte", "self_calibrated", "answer_masked")
FROM_TOKEN_MEAN = ("per_token", "per_byte", "self_calibrated")  # derived from a token_mean run's compat
COLUMNS = ["step", "model", "prompt_id", "task", "sample", "response", "n_tokens", "reward", "source_model",
           "kind", "compat", "mean_logp"]


def auroc(correct: list[float], wrong: list[float]) -> float:
    """P(c > w) + P(c = w) / 2 over finite-or-infinite, non-NaN scores; NaN if a side is empty."""
    c = np.asarray([x for x in correct if not np.isnan(x)], dtype=float)
    w = np.asarray([x for x in wrong if not np.isnan(x)], dtype=float)
    if len(c) == 0 or len(w) == 0:
        return float("nan")
    ws = np.sort(w)
    below = np.searchsorted(ws, c, side="left")  # wrong scores strictly below each correct one
    ties = np.searchsorted(ws, c, side="right") - below
    return float((below.sum() + 0.5 * ties.sum()) / (len(c) * len(w)))


def row_scores(rows: list[dict], gate_kind: str = "token_mean") -> list[dict]:
    """One dict per graft row: receiver, task, correct, and its score under each variant (NaN
    where the run's ``gate_kind`` does not give it: ``answer_masked`` from an answer-masked run's
    ``compat``, the others from a ``token_mean`` run's)."""
    lengths = donor_lengths(rows)
    own_means: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["kind"] == "own" and r["mean_logp"] is not None and np.isfinite(r["mean_logp"]):
            own_means[(r["step"], r["model"], r["prompt_id"])].append(r["mean_logp"])
    out = []
    for r in rows:
        if r["kind"] != "graft":
            continue
        ln_s = log_s(r["compat"])
        l_b = ln_s + r["mean_logp"] if r["mean_logp"] is not None else float("nan")
        receiver_own = own_means.get((r["step"], r["model"], r["prompt_id"]))
        scores = {"per_token": ln_s, "per_byte": graft_per_byte(r, lengths),
                  "self_calibrated": l_b - float(np.mean(receiver_own)) if receiver_own else float("nan")}
        if gate_kind == "answer_masked":
            scores = {**dict.fromkeys(FROM_TOKEN_MEAN, float("nan")), "answer_masked": ln_s}
        elif gate_kind == "token_mean":
            scores["answer_masked"] = float("nan")
        else:
            raise ValueError(f"gate_auroc: a {gate_kind!r} run's compat gives no variant here")
        out.append({"receiver": r["model"], "task": r["task"], "correct": r["reward"] > SUCCESS_THRESHOLD,
                    **scores})
    return out


def run_gate_kind(run: Path) -> str:
    """The run's ``exchange.gate_kind`` (``token_mean`` where its config predates the field)."""
    import yaml

    config = yaml.safe_load((run / "config.yaml").read_text())
    return (config.get("exchange") or {}).get("gate_kind") or "token_mean"


def read_store(run: Path) -> list[dict]:
    import pyarrow.dataset as ds

    return ds.dataset(str(run / "trajectories"), format="parquet").to_table(columns=COLUMNS).to_pylist()


def table(scores: list[dict]) -> dict[str, dict[str, dict]]:
    """{receiver: {task: {"n_correct", "n_wrong", <variant>: AUROC}}}."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for s in scores:
        groups[(s["receiver"], s["task"])].append(s)
    out: dict[str, dict[str, dict]] = defaultdict(dict)
    for (receiver, task), group in sorted(groups.items()):
        right = [g for g in group if g["correct"]]
        wrong = [g for g in group if not g["correct"]]
        out[receiver][task] = {
            "n_correct": sum(not np.isnan(g["per_token"]) for g in right),
            "n_wrong": sum(not np.isnan(g["per_token"]) for g in wrong),
            "n_correct_answer_masked": sum(not np.isnan(g["answer_masked"]) for g in right),
            "n_wrong_answer_masked": sum(not np.isnan(g["answer_masked"]) for g in wrong),
            **{v: auroc([g[v] for g in right], [g[v] for g in wrong]) for v in VARIANTS}}
    return dict(out)


def markdown(result: dict[str, dict[str, dict]], runs: list[Path]) -> str:
    lines = [f"Gate AUROC, correct vs wrong donor responses (`benchmarks/gate_auroc.py`; {len(runs)} runs: "
             + ", ".join(r.name for r in runs) + ")", "",
             "Correct / wrong: the rows of the token_mean runs (the first three variants) and of the "
             "answer-masked runs (the last).", "",
             "| receiver | task | correct | wrong | " + " | ".join(FROM_TOKEN_MEAN)
             + " | correct | wrong | answer_masked |",
             "|---|---|---|---|" + "---|" * len(VARIANTS) + "---|---|"]
    for receiver, tasks in result.items():
        for task, row in tasks.items():
            cell = {v: "-" if np.isnan(row[v]) else f"{row[v]:.3f}" for v in VARIANTS}
            lines.append(f"| {receiver} | {task} | {row['n_correct']} | {row['n_wrong']} | "
                         + " | ".join(cell[v] for v in FROM_TOKEN_MEAN)
                         + f" | {row['n_correct_answer_masked']} | {row['n_wrong_answer_masked']} | "
                         + f"{cell['answer_masked']} |")
    return "\n".join(lines) + "\n"


def plot(result: dict[str, dict[str, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r}\n{t}" for r, tasks in result.items() for t in tasks]
    rows = [row for tasks in result.values() for row in tasks.values()]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    for i, variant in enumerate(VARIANTS):
        ax.bar(x + (i - 1.5) * 0.2, [r[variant] for r in rows], width=0.2, label=variant)
    ax.axhline(0.5, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("AUROC (correct vs wrong)")
    ax.set_title("Does the gate's score tell a donor's right answers from its wrong ones?")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_folders(description: str) -> tuple[list[Path], Path]:
    """The store analyses' command line: the run folders given that hold a ``trajectories/``
    store (an error if none does), and ``--out``, created."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("runs", type=Path, nargs="+", help="run folders with a trajectories/ store")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = [r for r in args.runs if (r / "trajectories").is_dir()]
    if not runs:
        parser.error("no run folder with a trajectories/ store among the arguments")
    args.out.mkdir(parents=True, exist_ok=True)
    return runs, args.out


def main() -> None:
    runs, out = run_folders(__doc__.split("\n\n")[0])
    result = table([s for run in runs for s in row_scores(read_store(run), run_gate_kind(run))])
    (out / "gate_auroc.json").write_text(json.dumps({"runs": [str(r) for r in runs], "auroc": result},
                                                         indent=1) + "\n")
    (out / "gate_auroc.md").write_text(markdown(result, runs))
    plot(result, out / "gate_auroc.png")
    print(markdown(result, runs))


if __name__ == "__main__":
    main()
