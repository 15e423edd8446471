"""A finished run folder of one demo model (its config and final weights), for the tests that
serve it (``graftpool serve``) on a cluster."""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def served_run_folder(tmp_path: Path, name: str, overrides: list[str] | None = None) -> Path:
    """``tmp_path / name``: the demo pair's first model (llama-char) as a finished run, with
    ``overrides`` (``--set``'s) applied to its config."""
    from orchestrator.config import dump_config, load_config
    from orchestrator.models import resolve_model_path

    config = load_config(data={**yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text()),
                               "run": {"name": name, "output_dir": str(tmp_path)}}, overrides=overrides)
    config = config.model_copy(update={"models": config.models[:1]})
    run_dir = tmp_path / name
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    shutil.copytree(resolve_model_path(config.models[0]), run_dir / "final" / "llama-char")
    return run_dir
