"""``summary.json``: what a finished run reports (final, best and starting pass@1 per set, the
final pass@1 per task of a mixed eval set, the exchange totals, mean phase times, the deaths
survived and the restarts per actor), written to the run folder, its storage and MLflow."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.config import redact
from orchestrator.controller.faults import restarts

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext


def write_summary(ctx: RunContext, phases_measured: Sequence[str]) -> dict:
    """The run's summary, written; ``phases_measured``: the step phases timed in ``history``."""
    phases = {p: float(np.mean([h["timings"][p] for h in ctx.state.history])) for p in phases_measured}
    models = {}
    last_tasks = next((e.get("tasks", {}) for e in reversed(ctx.state.eval_history) if e["step"] > 0), {})
    for name in ctx.names:
        evals = [e["scores"][name] for e in ctx.state.eval_history if e["step"] > 0]
        sets = sorted(evals[-1]) if evals else []
        start = [e["scores"][name] for e in ctx.state.eval_history if e["step"] == 0]
        models[name] = {
            "final_pass@1": evals[-1] if evals else {},
            "best_pass@1": {s: max(e.get(s, 0.0) for e in evals) for s in sets},
            **({"start_pass@1": start[0]} if start else {}),
            **({"final_task_pass@1": last_tasks[name]} if last_tasks.get(name) else {}),
            "exchange": dict(ctx.state.totals[name]),
        }
    summary = redact({"run": ctx.config.run.name, "steps": len(ctx.state.history), "models": models,
                      "mean_step_time": phases, "mean_step_total": float(sum(phases.values())),
                      "mlflow_run_id": ctx.tracker.parent_id, "run_dir": str(ctx.run_dir),
                      "faults": ctx.state.faults, "restarts": restarts(ctx.state.faults)})  # run_dir: a path may quote a secret
    (ctx.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    ctx.mirror(ctx.run_dir / "summary.json")
    ctx.tracker.log_artifact(ctx.run_dir / "summary.json")
    return summary
