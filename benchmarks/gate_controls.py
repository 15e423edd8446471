"""Issue #53's 2x2, one table line per run folder: each receiver's weak-task pass@1 (the mean of
the tasks its warm start slips on, each task's figure in brackets), its strong-task mean (the
other eval sets), and the donor responses it trained on its weak tasks (store rows of kind
``graft`` or ``sgt`` with ``trained``, correct + wrong by the donor's reward), so that the figures
of ``benchmarks/results/gate_controls/README.md`` recompute from the run folders.

    .venv/bin/python -m benchmarks.gate_controls <run folder> [<run folder> ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from benchmarks.learning_report import weak_tasks
from graftpool.contracts import GRAFT, SGT, SUCCESS_THRESHOLD

DONOR_KINDS = (GRAFT, SGT)


def store_rows(run: Path) -> list[dict]:
    """The store's rows, the columns :func:`trained_donor_rows` reads."""
    import pyarrow.dataset as ds

    return ds.dataset(str(run / "trajectories"), format="parquet").to_table(
        columns=["model", "kind", "trained", "task", "reward"]).to_pylist()


def trained_donor_rows(rows: list[dict], receiver: str, tasks: list[str]) -> tuple[int, int]:
    """(correct, wrong) donor responses ``receiver`` trained on ``tasks`` (the store's rows)."""
    taken = [r for r in rows if r["model"] == receiver and r["kind"] in DONOR_KINDS and r["trained"]
             and r["task"] in tasks]
    correct = sum(r["reward"] > SUCCESS_THRESHOLD for r in taken)
    return correct, len(taken) - correct


def line(run: Path) -> str:
    """``| run | per receiver: weak (tasks) | strong | trained correct + wrong |``."""
    final = {m: s["final_pass@1"] for m, s in json.loads((run / "summary.json").read_text())["models"].items()}
    cells, rows = [run.name], store_rows(run)
    for model, tasks in weak_tasks(run).items():
        scores = final[model]
        strong = [t for t in scores if t != "avg" and t not in tasks]
        weak = sum(scores[t] for t in tasks) / len(tasks)
        cells += [f"{weak:.3f} ({', '.join(f'{scores[t]:.3f}' for t in tasks)})",
                  f"{sum(scores[t] for t in strong) / len(strong):.3f}",
                  "{} + {}".format(*trained_donor_rows(rows, model, tasks))]
    return "| " + " | ".join(cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+", help="run folders (each with summary.json)")
    for run in parser.parse_args(argv).runs:
        print(line(run))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
