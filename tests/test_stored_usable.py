"""A ``stored`` routing whose store holds no group this run could ever take is refused at start
(issue #51's forty-seventh read). ``StoredPeers.rewards_for`` gives a stored group of another size
than ``algorithm.n`` no rewards (k = -1: never eligible), and a prompt outside ``data.train`` is
never sampled: a store written by a run with another ``n``, or on other data, left every step
without a donor and the run training alone, with nothing said (``exchange/received`` 0).

The store is written by the run's own code (``records.store_table``, ``TrajectoryStore``); the start
is the controller's own, stopped where it would go on to build the models (no Ray, no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from orchestrator.controller import loop
from orchestrator.controller.records import store_table
from orchestrator.controller.trajectory_store import TrajectoryStore
from policies.stored import StoredPeers

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"


def _store(folder: Path, size: int, prompt_id: str = "p0") -> Path:
    """A store of one step: model ``peer``'s own group of ``size`` responses on ``prompt_id``, mixed."""
    rows = [dict(receiver="peer", model="peer", prompt_id=prompt_id, sample=i, prompt="12+35=",
                 rendered_prompt="12+35=", response="47" if i % 2 else "46", n_tokens=2, reward=float(i % 2),
                 reason="", trained_advantage=0.0, advantage=0.0, source_model="peer", kind="own", weight=1.0,
                 compat=None, mean_logp=-1.0, update=0, policy_version=1, finished=True) for i in range(size)]
    store = TrajectoryStore(folder)
    store.write_table(1, store_table(1, StepRecord.from_rows(rows, list(rows[0])), {prompt_id: "add"}))
    return store.folder


def _start(tmp_path: Path, store: Path, monkeypatch) -> loop.Controller:
    """The demo's first model, learning from ``store``'s model ``peer`` (algorithm.n 8), started."""
    data = yaml.safe_load(DEMO.read_text())
    data["models"] = data["models"][:1]
    data["exchange"] = {"name": "stored", "params": {"store": str(store), "peers": ["peer"]}}
    config = load_config(data=data, overrides=[f"run.output_dir={tmp_path / 'runs'}", "run.name=stored"])

    def went_on(model):
        raise AssertionError("the start took the store and went on to the models")

    monkeypatch.setattr(loop, "resolve_model_path", went_on)
    controller = loop.Controller(config)
    controller.start()
    return controller


def test_a_store_of_another_group_size_is_refused_at_start(tmp_path, monkeypatch):
    store = _store(tmp_path / "trajectories", size=4)
    peers = StoredPeers(store, "peer")
    assert np.isnan(peers.rewards_for(["p0"], 8)).all()  # what every step of an n = 8 run got from it
    with pytest.raises(ConfigError, match=r"exchange.params.store: .* groups of \[4\] responses .* algorithm.n is 8"):
        _start(tmp_path, store, monkeypatch)


def test_a_store_on_no_prompt_of_data_train_is_refused_at_start(tmp_path, monkeypatch):
    store = _store(tmp_path / "trajectories", size=8, prompt_id="elsewhere-0")
    with pytest.raises(ConfigError, match=r"none of the prompts of model 'peer'.* is in data.train"):
        _start(tmp_path, store, monkeypatch)


def test_a_store_with_a_group_this_run_can_take_passes(tmp_path):
    store = _store(tmp_path / "trajectories", size=8, prompt_id="add-1")
    peers = StoredPeers(store, "peer")
    peers.check_usable(["sub-0", "add-1"], 8)
    assert not np.isnan(peers.rewards_for(["add-1"], 8)).any()


def test_an_evaluation_of_a_stored_run_copied_back_without_its_store_reads_none(tmp_path, monkeypatch):
    """``graftpool eval RUN_DIR`` of a ``stored`` routing run copied back from a cluster (its store,
    an earlier run's ``trajectories/`` on the head, not copied): an evaluation reads no store, yet
    the start read it, and the evaluation stopped with ``FileNotFoundError: exchange.params.store: no
    trajectory store at ...``. The start now goes on to the models (stopped there, as above)."""
    import shutil

    from orchestrator.config import dump_config
    from orchestrator.config.final_models import final_models_config
    from orchestrator.models import resolve_model_path

    data = yaml.safe_load(DEMO.read_text())
    data["models"] = data["models"][:1]
    data["exchange"] = {"name": "stored", "params": {"store": str(tmp_path / "head" / "trajectories"),
                                                     "peers": ["peer"]}}
    config = load_config(data=data, overrides=[f"run.output_dir={tmp_path / 'back'}", "run.name=stored"])
    run_dir = tmp_path / "back" / "stored"
    (run_dir / "final").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(config))
    shutil.copytree(resolve_model_path(config.models[0]), run_dir / "final" / config.models[0].name)

    class ReachedTheModels(Exception):
        pass

    def reached(model):
        raise ReachedTheModels

    monkeypatch.setattr(loop, "resolve_model_path", reached)
    with pytest.raises(ReachedTheModels):
        loop.Controller(final_models_config(run_dir, ["models.0.generation.backend=hf"])).start(train=False)
