"""Matplotlib (Agg) figures from plain data: no MLflow, no files. Each function returns a
Figure; :func:`png_bytes` renders one (and closes it)."""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

Series = list[tuple[int, float]]
LINESTYLES = ("-", "--", ":", "-.")


def png_bytes(fig: Figure, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _step_axis(ax) -> None:
    """Integer step ticks; a single step gets some room around it."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    xs = {float(x) for line in ax.lines for x in line.get_xdata()}
    if len(xs) == 1:
        x = xs.pop()
        ax.set_xlim(x - 1, x + 1)


def _annotated_heatmap(ax, matrix: np.ndarray, rows: list[str], cols: list[str], labels,
                       cmap: str, vmax: float | None = None) -> None:
    shown = np.ma.masked_invalid(matrix.astype(float))
    vmax = vmax if vmax is not None else (float(np.nanmax(matrix)) if np.isfinite(matrix).any() else 1.0)
    im = ax.imshow(shown, cmap=cmap, vmin=0.0, vmax=max(vmax, 1e-9), aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=30, ha="right")
    ax.set_yticks(range(len(rows)), rows)
    for i in range(len(rows)):
        for j in range(len(cols)):
            text = labels(i, j)
            if text:
                value = matrix[i, j]
                dark = math.isfinite(value) and value > 0.6 * max(vmax, 1e-9)
                ax.text(j, i, text, ha="center", va="center", fontsize=9,
                        color="white" if dark else "black")
    ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.04)


def flow_heatmap(donors: list[str], receivers: list[str], panels: list[tuple[str, np.ndarray]]) -> Figure:
    """F[donor, receiver] (groups moved), one panel per (title, matrix), e.g. the last window
    of steps and the whole run. Rows are donors, columns receivers."""
    fig, axes = plt.subplots(1, len(panels), figsize=(1.6 + 2.6 * len(panels) * max(1, len(receivers)) / 2,
                                                      1.6 + 0.7 * len(donors)), squeeze=False)
    for ax, (title, matrix) in zip(axes[0], panels, strict=True):
        masked = matrix.astype(float).copy()
        for d, donor in enumerate(donors):
            for r, receiver in enumerate(receivers):
                if donor == receiver:
                    masked[d, r] = np.nan
        _annotated_heatmap(ax, masked, donors, receivers,
                           lambda i, j, m=masked: "" if np.isnan(m[i, j]) else f"{m[i, j]:.0f}", "Blues")
        ax.set_xlabel("receiver")
        ax.set_ylabel("donor")
        ax.set_title(title, fontsize=10)
    fig.suptitle("Exchange flow F[donor, receiver]: groups moved", fontsize=11)
    fig.tight_layout()
    return fig


def rate_curves(series: dict[str, dict[str, Series]],
                metrics: tuple[tuple[str, str], ...] = (
                    ("exchange/rate", "exchange rate (grafted / all-fail groups)"),
                    ("exchange/all_fail_rate", "all-fail rate (all-fail / prompts)")),
                ylim: tuple[float, float] = (-0.02, 1.02)) -> Figure:
    """One panel per metric, one line per model; ``series``: model -> metric -> [(step, v)]. ``ylim``:
    each panel's range, widened to hold its values: ``exchange/rate`` (groups received over all-fail
    groups) passes 1 where a receiver takes more than one group or response on an all-fail prompt
    (HACPO with three or more models: a peer group from each; SGT with ``count`` > 1: responses)."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.4), squeeze=False)
    for ax, (key, title) in zip(axes[0], metrics, strict=True):
        seen: list[float] = []
        for i, (model, keys) in enumerate(series.items()):
            points = [(s, v) for s, v in keys.get(key, []) if math.isfinite(v)]
            if points:
                steps, values = zip(*points, strict=True)
                seen += values
                ax.plot(steps, values, marker="o", markersize=3, linestyle=LINESTYLES[i // 10 % 4],
                        label=model)
        ax.set_ylim(min([ylim[0], *seen]), max([ylim[1], *(v * 1.02 for v in seen)]))
        _finish_panel(ax, title, legend_size=8)
    fig.tight_layout()
    return fig


PEER_PUSH_METRICS = (
    ("exchange/peer_push_ratio", "net peer push / its magnitude (sum w a / sum w |a|)"),
    ("train/peer_grad_share", "peer share of the gradient norm"),
)


def eval_curves(series: dict[str, dict[str, Series]], sets: list[str]) -> Figure:
    """pass@1 per eval set (one panel each), one line per model."""
    sets = sets or ["avg"]
    cols = min(3, len(sets))
    rows = math.ceil(len(sets) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 3.0 * rows), squeeze=False)
    for n, set_name in enumerate(sets):
        ax = axes[n // cols][n % cols]
        for i, (model, keys) in enumerate(series.items()):
            points = keys.get(f"eval/{set_name}/pass_at_1", [])
            if points:
                steps, values = zip(*points, strict=True)
                ax.plot(steps, values, marker="o", markersize=3, linestyle=LINESTYLES[i // 10 % 4],
                        label=model)
        ax.set_ylim(-0.02, 1.02)
        _finish_panel(ax, f"eval/{set_name}: pass@1", legend_size=8)
    return _finish_grid(fig, axes, len(sets), rows, cols)


def _finish_panel(ax, title: str, legend_size: int) -> None:
    """Title, step axis, grid and (when something was drawn) a legend for one curve panel."""
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("step")
    _step_axis(ax)
    ax.grid(alpha=0.3)
    if ax.has_data():
        ax.legend(fontsize=legend_size)


def _finish_grid(fig: Figure, axes, used: int, rows: int, cols: int) -> Figure:
    """Hide the unused panels of a rows x cols grid and tighten the layout."""
    for n in range(used, rows * cols):
        axes[n // cols][n % cols].axis("off")
    fig.tight_layout()
    return fig


def complementarity_heatmap(comp: dict) -> Figure:
    """C[A][B]: the fraction of A's all-fail prompts that B solves (k >= 1), with counts."""
    models = comp["models"]
    matrix = np.array([[np.nan if v is None else v for v in row] for row in comp["C"]], dtype=float)
    fig, ax = plt.subplots(figsize=(2.4 + 1.3 * len(models), 1.8 + 0.8 * len(models)))

    def label(i, j):
        if i == j:
            return ""
        if comp["C"][i][j] is None:
            return "-"
        return f"{comp['C'][i][j]:.2f}\n({comp['solved'][i][j]}/{comp['all_fail'][i]})"

    _annotated_heatmap(ax, matrix, [f"{m} (A)" for m in models], [f"{m} (B)" for m in models], label,
                       "Greens", vmax=1.0)
    ax.set_xlabel("B: the model that solves")
    ax.set_ylabel("A: all-fail on the prompt")
    ax.set_title("Complementarity: fraction of A's all-fail prompts B solves", fontsize=10)
    fig.tight_layout()
    return fig


def compare_curves(runs: dict[str, dict[str, dict[str, Series]]],
                   metrics: list[tuple[str, str]]) -> Figure:
    """Several runs on the same axes: one panel per metric, colour = run, line style = model.
    ``runs``: label -> model -> metric -> [(step, v)]."""
    cols = min(2, len(metrics))
    rows = math.ceil(len(metrics) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 3.6 * rows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    models = list(dict.fromkeys(m for series in runs.values() for m in series))
    for n, (key, title) in enumerate(metrics):
        ax = axes[n // cols][n % cols]
        for r, (label, series) in enumerate(runs.items()):
            for model, keys in series.items():
                points = [(s, v) for s, v in keys.get(key, []) if math.isfinite(v)]
                if points:
                    steps, values = zip(*points, strict=True)
                    ax.plot(steps, values, color=colors[r % len(colors)],
                            linestyle=LINESTYLES[models.index(model) % len(LINESTYLES)],
                            marker="o", markersize=3, label=f"{label}: {model}")
        _finish_panel(ax, title, legend_size=7)
    return _finish_grid(fig, axes, len(metrics), rows, cols)
