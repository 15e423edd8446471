"""``python -m orchestrator eval RUN_DIR``: pass@1 of a finished run's final models."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from orchestrator.config import ConfigError, load_config
from orchestrator.loop import Controller


def evaluate_run(run_dir: Path, overrides: list[str] | None = None) -> dict[str, dict[str, float]]:
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} is not a run folder: no config.yaml")
    data = yaml.safe_load(config_file.read_text())
    for model in data["models"]:
        final = run_dir / "final" / model["name"]
        if not final.is_dir():
            raise ConfigError(f"{run_dir}: no final weights for model {model['name']} at {final}")
        model["path"], model["builder"] = str(final), None
    data["run"]["output_dir"] = str(run_dir.parent)
    config = load_config(data=data, overrides=overrides)
    controller = Controller(config)
    status = "FAILED"
    try:
        controller.start(train=False)
        if not controller.eval_sets:
            raise ConfigError("data.eval: the run has no eval sets")
        scores = controller.evaluate(step=config.run.steps)
        (run_dir / "eval.json").write_text(json.dumps(scores, indent=2))
        status = "FINISHED"
        return scores
    finally:
        controller.close(status)
