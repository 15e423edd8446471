"""The learning benchmark's plots: the rows' primary and secondary metrics, per-task learning
curves, the exchange's flow matrices and the gate's admission of the donor's correct and wrong
responses per task (from each run's ``store_summary.json``, ``benchmarks/exchange_analysis.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np

from benchmarks.learning_methods import Method
from benchmarks.learning_report import eval_curves, run_digest, weak_tasks
from benchmarks.paired_report import SeedScores, is_exchange_configuration

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _run(row: Method, seed: int, runs: Path) -> Path:
    return runs / f"{row.slug}-s{seed}"


def plot_table(primary: SeedScores, average: SeedScores, rows: list[Method], models: tuple[str, ...],
               path: Path) -> None:
    """Two panels, weak-task pass@1 and the 5-set average: mean ± sd over seeds per row and model."""
    names = [r.name for r in rows if r.name in primary]
    if not names:
        return
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8), sharey=False)
    x, width = np.arange(len(names)), 0.8 / len(models)
    for ax, scores, label in ((axes[0], primary, "weak-task pass@1 (primary)"),
                              (axes[1], average, "5-set average pass@1 (secondary)")):
        for i, model in enumerate(models):
            vals = [list(scores.get(n, {}).get(model, {}).values()) for n in names]
            ax.bar(x + (i - (len(models) - 1) / 2) * width, [np.mean(v) if v else np.nan for v in vals], width,
                   yerr=[np.std(v, ddof=1) if len(v) > 1 else 0 for v in vals], capsize=3, label=model)
        ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("Table 1 in the premise regime: mean ± sd over the selection seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_task_curves(runs: Path, rows: list[Method], seeds: list[int], path: Path) -> None:
    """Per model, one panel per eval set: pass@1 over training (mean over seeds), a line per row;
    the model's weak tasks are marked."""
    present = [r for r in rows if any((_run(r, s, runs) / "summary.json").is_file() for s in seeds)]
    if not present:
        return
    first = next(_run(present[0], s, runs) for s in seeds if (_run(present[0], s, runs) / "summary.json").is_file())
    models = present[0].models
    weak = weak_tasks(first)
    sets = sorted(s for s in eval_curves(first, models[0]) if s != "avg") + ["avg"]
    fig, axes = plt.subplots(len(models), len(sets), figsize=(3.2 * len(sets), 2.9 * len(models)), squeeze=False)
    for r, model in enumerate(models):
        for c, name in enumerate(sets):
            ax = axes[r][c]
            for row in present:
                curves = [dict(eval_curves(_run(row, s, runs), model).get(name, [])) for s in seeds
                          if (_run(row, s, runs) / "summary.json").is_file()]
                steps = sorted(set.intersection(*(set(curve) for curve in curves))) if curves else []
                if steps:
                    ax.plot(steps, [np.mean([curve[s] for curve in curves]) for s in steps], marker="o",
                            markersize=2.5, label=row.name)
            is_weak = name in weak.get(model, [])
            ax.set_title(f"{model}: {name}" + (" (weak)" if is_weak else ""), fontsize=9,
                         color="firebrick" if is_weak else "black")
            ax.set_ylim(-0.02, 1.02)
            ax.tick_params(labelsize=7)
    axes[0][-1].legend(fontsize=6, loc="upper left")
    fig.supxlabel("training step (0: the warm start)")
    fig.supylabel("held-out pass@1 (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def mean_flow(run: Path) -> tuple[list[str], np.ndarray] | None:
    """A run's flow matrix F[donor, receiver], groups moved per step, averaged over its steps."""
    flow = run_digest(run).get("flow")
    return None if flow is None else (flow["donors"], np.asarray(flow["mean"], dtype=float))


def plot_flows(runs: Path, rows: list[Method], seeds: list[int], path: Path) -> None:
    """One heatmap per exchange row: F[donor, receiver] per step, mean over steps and seeds."""
    panels = []
    for row in rows:
        if not is_exchange_configuration(row.name) and "gate closed" not in row.name:
            continue
        flows = [f for s in seeds if (f := mean_flow(_run(row, s, runs))) is not None]
        if flows:
            panels.append((row.name, flows[0][0], np.mean([f[1] for f in flows], axis=0)))
    if not panels:
        return
    cols = min(4, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 3.2 * rows_n), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (name, donors, flow) in zip(axes.flat, panels, strict=False):
        ax.axis("on")
        ax.imshow(flow, cmap="Blues")
        ax.set_xticks(range(flow.shape[1]), donors[:flow.shape[1]], rotation=30, fontsize=7)
        ax.set_yticks(range(flow.shape[0]), donors, fontsize=7)
        for (i, j), v in np.ndenumerate(flow):
            ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("receiver", fontsize=7)
        ax.set_ylabel("donor", fontsize=7)
    fig.suptitle("Flow matrices: groups moved per step (mean over steps and seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def admission_by_task(run: Path) -> dict[str, dict[str, dict[str, float]]]:
    """receiver -> task -> {"correct", "wrong"}: the share of the offered donor responses of that
    correctness the gate admitted, from the run's ``store_summary.json``."""
    path = run / "store_summary.json"
    if not path.is_file():
        return {}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for model, figures in json.loads(path.read_text()).items():
        for task, t in figures.get("tasks", {}).items():
            rates = {}
            for kind in ("correct", "wrong"):
                offered = t.get(f"offered_{kind}", 0)
                rates[kind] = t.get(f"admitted_{kind}", 0) / offered if offered else float("nan")
            out.setdefault(model, {})[task] = rates
    return out


def plot_gate_by_task(runs: Path, rows: list[Method], seeds: list[int], path: Path) -> None:
    """Per exchange row and receiver: the gate's admission rate of the donor's correct and wrong
    responses on each task (mean over seeds)."""
    panels = []
    for row in rows:
        if not is_exchange_configuration(row.name):
            continue
        per_seed = [a for s in seeds if (a := admission_by_task(_run(row, s, runs)))]
        for model in row.models:
            tasks = sorted({t for a in per_seed for t in a.get(model, {})})
            if tasks:
                rates = {kind: [np.nanmean([a.get(model, {}).get(t, {}).get(kind, np.nan) for a in per_seed])
                                for t in tasks] for kind in ("correct", "wrong")}
                panels.append((f"{row.name}: {model}", tasks, rates))
    if not panels:
        return
    cols = min(4, len(panels))
    rows_n = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(3.6 * cols, 2.8 * rows_n), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    for ax, (title, tasks, rates) in zip(axes.flat, panels, strict=False):
        ax.axis("on")
        x = np.arange(len(tasks))
        ax.bar(x - 0.2, rates["correct"], 0.4, label="donor correct", color="seagreen")
        ax.bar(x + 0.2, rates["wrong"], 0.4, label="donor wrong", color="indianred")
        ax.set_xticks(x, tasks, fontsize=7)
        ax.set_ylim(0, 1.05)
        ax.set_title(title, fontsize=8)
        ax.tick_params(labelsize=7)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle("Gate admission of peer responses by correctness and task (mean over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
