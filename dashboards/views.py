"""The plots a job logs to MLflow at eval steps and at the end (the controller's hook).

Artifacts of the parent run (and files in ``<run folder>/plots/``):
``plots/flow_heatmap.png`` (F[donor, receiver] over the last window of steps, and over the
whole run), ``plots/flow/step_NNNNNN.png`` (a snapshot of it at each view),
``plots/exchange_rates.png`` (exchange and all-fail rate per model and step),
``plots/peer_push.png`` (the net peer push ratio and the peer share of the gradient, per step),
``plots/eval_pass_at_1.png`` (pass@1 per eval set, per model), ``plots/complementarity.png``
and ``plots/complementarity.json`` (for each pair (A, B), the fraction of A's all-fail
prompts that B solves, from the trajectory store).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

from dashboards.data import RunData, complementarity, from_history

VIEW_FILES = ("flow_heatmap.png", "exchange_rates.png", "peer_push.png", "eval_pass_at_1.png", "complementarity.png")


def render_views(data: RunData, step: int | None = None, window: int | None = None) -> dict:
    """Figures by file name; ``window``: how many steps the first heatmap panel covers."""
    from dashboards import plots

    steps = data.steps()
    step = step if step is not None else (steps[-1] if steps else 0)
    first_step = steps[0] if steps else 1
    first = max(first_step, step - window + 1) if window else first_step
    panels = [(f"steps {first}-{step}", data.flow(first, step))]
    if first > first_step:
        panels.append((f"all steps {first_step}-{step}", data.flow(None, step)))
    models = {m: data.series.get(m, {}) for m in data.models}
    figures = {
        "flow_heatmap.png": plots.flow_heatmap(data.donors(), data.models, panels),
        "exchange_rates.png": plots.rate_curves(models),
        "peer_push.png": plots.rate_curves(models, plots.PEER_PUSH_METRICS, ylim=(-1.02, 1.02)),
        "eval_pass_at_1.png": plots.eval_curves(models, data.eval_sets()),
    }
    if data.complementarity and len(data.complementarity["models"]) > 1:
        figures["complementarity.png"] = plots.complementarity_heatmap(data.complementarity)
    return figures


def log_views(tracker, history: list[dict], eval_history: list[dict], store_dir: str | Path,
              step: int, window: int | None = None) -> dict[str, Path]:
    """Render the views from the controller's history and the trajectory store, write them
    to ``<run folder>/plots/`` and log them to the parent run. Never raises: a failure
    here is a warning, training goes on. Returns the written files by name."""
    key = (step, len(history), len(eval_history))
    if getattr(tracker, "_views_logged", None) == key:
        return {}
    written: dict[str, Path] = {}
    try:
        from dashboards.plots import png_bytes

        comp = complementarity(store_dir, tracker.models)
        data = from_history(tracker.run_name, tracker.models, history, eval_history, comp)
        out = Path(tracker.local_dir) / "plots"
        (out / "flow").mkdir(parents=True, exist_ok=True)
        for name, fig in render_views(data, step, window).items():
            path = out / name
            path.write_bytes(png_bytes(fig))
            written[name] = path
            tracker.log_artifact(path, artifact_path="plots")
        snapshot = out / "flow" / f"step_{step:06d}.png"
        shutil.copyfile(written["flow_heatmap.png"], snapshot)
        tracker.log_artifact(snapshot, artifact_path="plots/flow")
        written["snapshot"] = snapshot
        if comp is not None:
            path = out / "complementarity.json"
            path.write_text(json.dumps(comp, indent=1))
            tracker.log_artifact(path, artifact_path="plots")
            written["complementarity.json"] = path
        tracker._views_logged = key
    except Exception as exc:  # noqa: BLE001 - views must never stop training
        warnings.warn(f"dashboard views at step {step} failed ({type(exc).__name__}: {exc}); "
                      "training goes on", stacklevel=2)
    return written
