"""A finished run folder's config for an evaluation of its final models (``graftpool eval RUN_DIR``
and ``--endpoint``, issue #51's thirty-third read): what a folder copied back from a cluster needs
on a machine that has neither the head's model folders and train file nor the trainer's packages."""

from __future__ import annotations

import warnings
from pathlib import Path

from orchestrator.config.base import SAFE_NAME, ConfigError
from orchestrator.config.loading import load_config


def final_models_config(run_dir: Path, overrides: list[str] | None = None, generates: bool = True):
    """A run folder's config for an evaluation of its final models: each model's ``path`` its
    ``final/<model>`` (LoRA: merged into it, ``workers.lora``), the folder itself the run folder
    (``run.output_dir`` / ``run.name``, resolved: a copy under a name of its own, or ``.``, keeps the
    evaluation's ``metrics.eval.jsonl`` and ``mlflow.eval.json``, not ``<parent>/<run.name>``, where
    another run of that name keeps its own). An evaluation starts no trainer, so the trainer
    backends' packages are not asked for (a run copied back from a DeepSpeed cluster is evaluated
    where DeepSpeed is not installed); ``generates=False`` (``--endpoint``: the server generates)
    asks for no generation backend either, and a model without ``final/<model>`` keeps its own
    ``path`` or ``builder``. A train file that is not on this machine (a copy of a cluster's run) is
    replaced by a one-problem synthetic set, with a warning: an evaluation reads the eval sets only."""
    import yaml

    run_dir = Path(run_dir).resolve()
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise ConfigError(f"{run_dir} is not a run folder: no config.yaml")
    if not SAFE_NAME.match(run_dir.name):  # it names the evaluation's MLflow run and local files
        raise ConfigError(f"{run_dir}: an evaluation's run folder is the folder itself, whose name names its "
                          "MLflow run: rename it with letters, digits, '_', '-' and '.' only")
    data = yaml.safe_load(config_file.read_text())
    for model in data["models"]:
        final = run_dir / "final" / model["name"]
        if not final.is_dir():
            if not generates:  # the server has the weights: the config's own source stands
                continue
            raise ConfigError(f"{run_dir}: no final weights for model {model['name']} at {final}")
        model["path"], model["builder"], model["lora"] = str(final), None, None
    data["run"]["output_dir"], data["run"]["name"] = str(run_dir.parent), run_dir.name
    train = (data.get("data") or {}).get("train") or {}
    if train.get("path") and not Path(train["path"]).exists():  # the head's /data/...: not used here
        warnings.warn(f"data.train: {train['path']} is not on this machine; an evaluation does not use the "
                      "train set (the run checked its eval sets against it), so none is read", stacklevel=2)
        data["data"]["train"] = {"source": "synthetic", "size": 1}
    return load_config(data=data, overrides=overrides, check_backends=generates, trains=False)
