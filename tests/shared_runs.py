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


def plugin_run_folder(folder: Path, plugin: Path, function: str, rewards: list[float],
                      **data: object) -> tuple[Path, str, str]:
    """A finished run as ``benchmarks.learning_report`` reads it, in ``folder/run``: the demo's
    first model alone (its final model the built one), verified by ``python:<plugin>:<function>``
    (with ``data`` settings), and a store of one step whose rows for the training set's first
    prompt have ``rewards``. Returns the run folder, the model's name and that prompt's id."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.controller.prompts import load_data
    from orchestrator.models import resolve_model_path

    config = yaml.safe_load(DEMO.read_text())
    config["exchange"], config["models"] = {"name": "none"}, config["models"][:1]
    config["data"].update(verifier=f"python:{plugin}:{function}", **data)
    run_dir = folder / "run"
    (run_dir / "trajectories").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_config(run_dir / "config.yaml")
    model = loaded.models[0]
    (run_dir / "final").mkdir()
    (run_dir / "final" / model.name).symlink_to(Path(resolve_model_path(model)).resolve())
    prompt_id = load_data(loaded.data.train, [], loaded.run.seed)[0][0].prompt_id
    rows = len(rewards)
    pq.write_table(pa.table({"step": [1] * rows, "model": [model.name] * rows, "prompt_id": [prompt_id] * rows,
                             "kind": ["own"] * rows, "reward": rewards}), run_dir / "trajectories" / "step.parquet")
    return run_dir, model.name, prompt_id
