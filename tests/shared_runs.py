"""Runs that tests of more than one module read as they are, made once per test process (session
fixtures in ``tests/conftest.py``); ``tests/xdist_units.py`` keeps the modules that read one on
one worker."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.config import Config, load_config
from orchestrator.controller.loop import train

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"
# the demo pair, 2 steps of 16 prompts, no evaluation
SHORT_PAIR = ["run.eval_every=0", "data.eval=[]", "run.steps=2", "algorithm.prompt_batch=16"]


def graft_pair_run(out: Path) -> Path:
    """The demo pair under :data:`SHORT_PAIR` with the ``graft`` preset and its default gate
    (``exchange.gate_kind: token_mean``), in ``out/graft``; returns the run folder."""
    train(load_config(DEMO, [*SHORT_PAIR, "exchange.name=graft", f"run.output_dir={out}", "run.name=graft"]))
    return out / "graft"


def one_model_config(folder: Path, name: str, overrides: list[str]) -> Config:
    """The demo's first model alone, no exchange, written to ``folder/<name>.yaml`` in the demo's
    key order (the zoo's cache key) and loaded with ``overrides``; its runs in ``folder/runs``."""
    config = yaml.safe_load(DEMO.read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return load_config(folder / f"{name}.yaml", [*overrides, f"run.output_dir={folder / 'runs'}"])
