"""A model folder the driver resolved reaches actors that run elsewhere (``workers.model_files``,
``orchestrator.cluster.model_shipping``): real Ray actors (a generation replica and a trainer
rank) started in a working folder of their own, as a ``ray job submit`` job's actors are."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from orchestrator.cluster.model_shipping import ModelShipment, _sees
from workers.file_chunks import read_tree
from workers.model_files import SHIPPED_MARKER, ModelSource, fingerprint, local_model, node_cache
from workers.rollout.generation import GenerationWorker, SamplingParams
from workers.rollout.settings import GenerationSettings
from workers.training.trainer import TorchTrainer


@pytest.fixture
def folders(tmp_path, paths, monkeypatch):
    """A copy of the demo's llama model in the driver's working folder (``driver/model``) and an
    empty working folder for the actors (``actors``); the driver works in ``driver``."""
    driver, actors = tmp_path / "driver", tmp_path / "actors"
    shutil.copytree(paths["llama-char"], driver / "model")
    actors.mkdir()
    (actors / "README").write_text("the actors' working folder\n")
    monkeypatch.chdir(driver)
    # a per-actor working_dir is taken from a URI only (a folder is uploaded for a whole job)
    return driver, Path(shutil.make_archive(str(tmp_path / "actors"), "zip", tmp_path, "actors"))


def _start(ray, source, actors: Path):
    """A replica and a trainer rank on ``source``, in a copy of ``actors`` (a zip) as their working
    folder; the node cache they write shipped folders into."""
    env = {"runtime_env": {"working_dir": actors.as_uri()}, "num_cpus": 0.5}
    replica = ray.remote(GenerationWorker).options(**env).remote(GenerationSettings(path=source), "llama-char")
    trainer = ray.remote(TorchTrainer).options(**env).remote(source)
    where = ray.remote(lambda: (str(node_cache()), os.getcwd())).options(runtime_env=env["runtime_env"]).remote()
    cache, cwd = ray.get(where)
    assert cwd != os.getcwd() and Path(cwd, "README").is_file()
    return replica, trainer, Path(cache)


def _weights(ray, trainer) -> dict[str, torch.Tensor]:
    return ray.get(trainer.weights_for_sync.remote())


def test_a_relative_folder_is_loaded_where_the_actors_see_it_and_nothing_is_shipped(ray_local, folders):
    driver, actors = folders
    shipment = ModelShipment("model")  # relative to the driver's working folder
    source = shipment.source_for([ray_local.get_runtime_context().get_node_id()])
    assert source == ModelSource(str(driver / "model"), fingerprint(driver / "model"), None)
    replica, trainer, cache = _start(ray_local, source, actors)
    texts = ray_local.get(replica.generate.remote(["1+1="], SamplingParams(n=2, max_new_tokens=4)))
    assert len(texts[0].responses) == 2
    expected = AutoModelForCausalLM.from_pretrained(str(driver / "model")).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in _weights(ray_local, trainer).items())
    assert not list(cache.glob(f"model-{source.fingerprint[:16]}*"))  # nothing copied
    for actor in (replica, trainer):
        ray_local.kill(actor)


def test_a_folder_the_actors_do_not_see_is_shipped_and_written_once_on_their_node(ray_local, folders):
    driver, actors = folders
    shipment = ModelShipment(driver / "model")
    shipment.ship()  # what source_for does once a node of the model's actors does not see the folder
    source = shipment.source_for([])
    assert source.files is not None
    gone = driver.parent / "elsewhere"
    (driver / "model").rename(gone)  # the folder exists on the driver's node alone
    assert ray_local.get(_sees.remote(source.path, source.fingerprint)) is False
    assert ray_local.get(_sees.remote(str(gone), source.fingerprint)) is True
    replica, trainer, cache = _start(ray_local, source, actors)
    texts = ray_local.get(replica.generate.remote(["1+1="], SamplingParams(n=2, max_new_tokens=4)))
    assert len(texts[0].responses) == 2
    expected = AutoModelForCausalLM.from_pretrained(str(gone)).state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in _weights(ray_local, trainer).items())
    copy = cache / f"model-{source.content[:16]}"
    assert read_tree(copy) == {**read_tree(gone), SHIPPED_MARKER: source.fingerprint.encode()}
    for actor in (replica, trainer):
        ray_local.kill(actor)
    shutil.rmtree(copy)


def test_two_shipped_folders_of_one_name_and_size_are_two_copies_on_a_node(ray_local, tmp_path, monkeypatch):
    """Issue #51's forty-sixth read: a node's copy of a shipped folder was named by the folder's
    name and its fingerprint (file sizes and config.json), which a run's ``final/<model>``
    re-exported by a resumed run (or another run's of the same model name) shares with the old
    one: weights of the same shapes. A node that kept the first copy loaded it for the second
    (``graftpool serve``, ``graftpool eval``, a run starting from it): the old weights, silently.
    Now the copy is named by the shipped bytes."""
    monkeypatch.setenv("GRAFTPOOL_CACHE", str(tmp_path / "cache"))
    loaded = []
    for run, weights in (("a", bytes(range(256)) * 4), ("b", bytes(reversed(range(256))) * 4)):
        folder = tmp_path / run / "final" / "model"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text('{"model_type": "llama"}\n')
        (folder / "model.safetensors").write_bytes(weights)
        shipment = ModelShipment(folder)
        shipment.ship()
        source = shipment.source_for([])
        folder.rename(tmp_path / run / "elsewhere")  # the node does not see the driver's folder
        loaded.append((Path(local_model(source)) / "model.safetensors").read_bytes())
    assert fingerprint(tmp_path / "a" / "elsewhere") == fingerprint(tmp_path / "b" / "elsewhere")
    assert loaded == [bytes(range(256)) * 4, bytes(reversed(range(256))) * 4]


def test_actors_started_again_after_their_node_is_lost_get_the_folder_shipped(tmp_path):
    """Issue #51's eighth read: a node of a model's placement group is lost (a GPU node of a
    multi-day run) and no node left can hold its bundle, which waits for the autoscaler's new
    node: Ray's table names no node for it (``''``). The model's actors started again asked each
    node of the group whether it sees the folder, '' too, and Ray refused the probe (``ValueError:
    Invalid node_id ''``), so the recovery failed the run. Now such a bundle's actors get the files
    shipped, and an actor on the new node, which does not see the driver's folder, loads them
    (``tests/node_loss_shipping.py``: a ``ray.cluster_utils.Cluster`` on 127.0.0.1, its own process)."""
    import json
    import subprocess
    import sys

    folder = tmp_path / "model"
    folder.mkdir()
    config = '{"model_type": "llama"}\n'
    (folder / "config.json").write_text(config)
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    env = {**os.environ, "GRAFTPOOL_CACHE": str(tmp_path / "cache")}  # the nodes' shipped copies
    done = subprocess.run([sys.executable, "-m", "tests.node_loss_shipping", str(folder)], cwd=Path(__file__).parents[1],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["bundle_nodes"] == [""]  # the lost node's bundle waits for a node
    assert result["error"] is None
    assert result["shipped"] is True
    assert Path(result["loaded"]).parent == tmp_path / "cache" / "shipped"
    assert result["loaded_config"] == config
