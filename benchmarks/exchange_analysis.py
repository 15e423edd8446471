"""The figures behind what an exchange does to its receivers, read from learning-benchmark run
folders (issue #28's hypotheses, kept as the columns of the table).

``python -m benchmarks.exchange_analysis benchmarks/results/learning_premise`` writes
``hypotheses.md`` there: per method and model (mean over the seeds present), from each run's
``run_digest.json`` (step means of the metrics) and ``store_summary.json`` (the trajectory
store's figures), so a results copy that keeps those two and no raw files is enough:

- H1 (net-negative push): the gate's admission rate of the donor's correct and wrong responses,
  the net push ratio sum w a / sum w |a| of the admitted peer rows (step mean), and on each of
  the model's weak tasks that push and the admission of the donor's correct and wrong responses
  (:func:`store_summary`);
- H2 (a peer-only update each step): peer-only updates per step, the peer share of the gradient
  norm, and the own rows' updates per step;
- H3 (horizon): each weak task's pass@1 at every evaluation (step 0 = the warm start);
- H4 (token budget): the share of the donor's correct responses on each weak task that the
  receiver could not have written within its own ``max_new_tokens`` (re-tokenised length above
  it), and the share of the receiver's own responses there that hit the budget.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import yaml

from benchmarks.learning_report import eval_curves, run_means, weak_tasks


def _budgets(run: Path) -> dict[str, int]:
    config = yaml.safe_load((run / "config.yaml").read_text())
    return {m["name"]: int((m.get("generation") or {}).get("max_new_tokens", 64)) for m in config["models"]}


def store_summary(run: Path) -> dict:
    """The trajectory store's figures of one run, per receiver, cached as ``store_summary.json`` in
    the run folder (so a results copy keeps them without the store; a folder with neither gives
    {}). Per task of the receiver's rows:

    - ``offered_correct`` / ``admitted_correct``, ``offered_wrong`` / ``admitted_wrong``: the donor
      responses a route gave it (``graft`` rows), by their reward (correct: above 0.5), and those
      trained with a non-zero weight (admitted by the gate);
    - ``push`` = sum w a and ``push_abs`` = sum w |a| over the admitted ones;
    - ``donor_correct``, ``donor_correct_tokens``: the correct ones and their re-tokenised lengths'
      sum; ``donor_correct_over_budget``: how many are longer than the receiver's ``max_new_tokens``;
    - ``own``, ``own_at_budget``: the receiver's own responses and those that hit its budget.
    """
    cache = run / "store_summary.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (run / "trajectories").is_dir():
        return {}
    table = ds.dataset(str(run / "trajectories"), format="parquet").to_table(
        columns=["model", "task", "kind", "reward", "advantage", "weight", "trained", "n_tokens"]).to_pylist()
    budgets = _budgets(run)
    out: dict[str, dict] = {}
    for r in table:
        tasks = out.setdefault(r["model"], {"tasks": {}})["tasks"]
        t = tasks.setdefault(r["task"], dict.fromkeys(
            ("offered_correct", "admitted_correct", "offered_wrong", "admitted_wrong", "push", "push_abs",
             "donor_correct", "donor_correct_tokens", "donor_correct_over_budget", "own", "own_at_budget"), 0))
        if r["kind"] == "graft":
            which = "correct" if r["reward"] > 0.5 else "wrong"
            t[f"offered_{which}"] += 1
            if r["trained"] and r["weight"] > 0:
                t[f"admitted_{which}"] += 1
                t["push"] += r["weight"] * r["advantage"]
                t["push_abs"] += r["weight"] * abs(r["advantage"])
            if which == "correct":
                t["donor_correct"] += 1
                t["donor_correct_tokens"] += r["n_tokens"]
                t["donor_correct_over_budget"] += int(r["n_tokens"] > budgets[r["model"]])
        elif r["kind"] == "own":
            t["own"] += 1
            t["own_at_budget"] += int(r["n_tokens"] >= budgets[r["model"]])
    cache.write_text(json.dumps(out, indent=1))
    return out


def run_figures(run: Path) -> dict[str, dict]:
    """Every hypothesis' figures of one run folder, per model: step means of the update metrics,
    and on each weak task the push ratio, the budget shares (from :func:`store_summary`) and the
    pass@1 curve."""
    summary, weak = store_summary(run), weak_tasks(run)
    out = {}
    for model, tasks in weak.items():
        metrics = run_means(run, model)
        curves = eval_curves(run, model)
        per_task = {}
        for task in tasks:
            t = summary.get(model, {}).get("tasks", {}).get(task, {})
            per_task[task] = {
                "push_ratio": t["push"] / t["push_abs"] if t.get("push_abs") else None,
                "admit_correct": t["admitted_correct"] / t["offered_correct"] if t.get("offered_correct") else None,
                "admit_wrong": t["admitted_wrong"] / t["offered_wrong"] if t.get("offered_wrong") else None,
                "donor_correct_over_budget": (t["donor_correct_over_budget"] / t["donor_correct"]
                                              if t.get("donor_correct") else None),
                "own_at_budget": t["own_at_budget"] / t["own"] if t.get("own") else None,
                "curve": curves.get(task, []),
            }
        out[model] = {"metrics": metrics, "weak": per_task}
    return out


def _fmt(values: list, digits: int = 2) -> str:
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return f"{np.mean(finite):.{digits}f}" if finite else "-"


def report(folder: Path, runs_subdir: str = "runs") -> str:
    """``hypotheses.md`` for every run folder under ``folder/<runs_subdir>`` (method = the folder
    name without its ``-s<seed>``)."""
    runs: dict[str, list[Path]] = defaultdict(list)
    for run in sorted((folder / runs_subdir).glob("*-s[0-9]*")):
        if (run / "summary.json").is_file():
            runs[run.name.rsplit("-s", 1)[0]].append(run)
    lines = ["# What the exchange did to each receiver: the figures behind each hypothesis", "",
             "Produced by `python -m benchmarks.exchange_analysis " + str(folder) + "` from each run's "
             "`run_digest.json` and `store_summary.json` (mean over the seeds listed). Weak-task cells: the "
             "net push ratio of the admitted peer rows, the gate's admission of the donor's correct / wrong "
             "responses on that task, the share of the donor's correct responses longer than the receiver's "
             "budget, the share of the receiver's own responses at its budget; then pass@1 by step.", ""]
    figures = {method: [run_figures(r) for r in paths] for method, paths in runs.items()}
    models = sorted({m for per_run in figures.values() for f in per_run for m in f})
    for model in models:
        lines += [f"## {model}", "",
                  "| method | seeds | admit + / - | push ratio | peer-only upd / step | own-only upd / step | "
                  "mixed upd / step | peer grad share | weak task: push, admit + / -, donor-correct over budget, "
                  "own at budget; pass@1 by step |", "|---|---|---|---|---|---|---|---|---|"]
        for method, per_run in figures.items():
            runs_of_model = [f[model] for f in per_run if model in f]
            if not runs_of_model:
                continue
            m = {k: [r["metrics"][k] for r in runs_of_model] for k in runs_of_model[0]["metrics"]}
            weak_cells = []
            for task in runs_of_model[0]["weak"]:
                items = [r["weak"][task] for r in runs_of_model]
                steps = sorted({s for it in items for s, _ in it["curve"]})
                curve = " ".join(f"{s}:{np.mean([dict(it['curve']).get(s, np.nan) for it in items]):.2f}"
                                 for s in steps)
                weak_cells.append(f"**{task}** {_fmt([it['push_ratio'] for it in items])}, "
                                  f"{_fmt([it['admit_correct'] for it in items])} / "
                                  f"{_fmt([it['admit_wrong'] for it in items])}, "
                                  f"{_fmt([it['donor_correct_over_budget'] for it in items])}, "
                                  f"{_fmt([it['own_at_budget'] for it in items])}; {curve}")
            seeds = ", ".join(p.name.rsplit("-s", 1)[1] for p in runs[method])
            lines.append(f"| {method} | {seeds} | {_fmt(m['admit_pos'])} / "
                         f"{_fmt(m['admit_neg'])} | {_fmt(m['peer_push'])} | "
                         f"{_fmt(m['peer_only_updates'])} | {_fmt(m['own_only_updates'])} | "
                         f"{_fmt(m['mixed_updates'])} | {_fmt(m['peer_grad'])} | "
                         + "<br>".join(weak_cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a bench-learning --out folder")
    parser.add_argument("--runs-subdir", default="runs", help="its run folders' folder (a results copy: run_data)")
    args = parser.parse_args(argv)
    text = report(args.folder, args.runs_subdir)
    (args.folder / "hypotheses.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
