"""``models[].generation.weight_sync`` as a registry (orchestrator/cluster/weight_sync_modes): the
config accepts what is registered and refuses the rest naming the field, no code outside the
modes branches on a mode's name, and a mode registered by a test carries a real run's weights
(issue #54)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar

import pytest

from orchestrator.cluster.weight_sync_modes.base import register_weight_sync
from orchestrator.cluster.weight_sync_modes.object_store import ObjectStoreSync
from orchestrator.config import ConfigError, load_config
from orchestrator.config.weight_syncs import KEEPS_WEIGHTS, LAZY, WEIGHT_SYNCS
from orchestrator.controller.loop import Controller
from tests.platform_checks import read_store

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
SHORT = ["run.steps=2", "run.eval_every=0", "algorithm.prompt_batch=4"]
KEY = ("step", "model", "prompt_id", "source_model", "sample")


class LoggedObjectStore(ObjectStoreSync):
    """The object store's sync, each call logged (model, replicas): a mode no built-in code knows."""

    log: ClassVar[list[tuple[str, list[int] | None]]] = []

    def sync(self, actors, only=None):
        self.log.append((actors.name, only))
        return super().sync(actors, only)


class Forgetful(ObjectStoreSync):
    """A mode that does not keep the synced weights for a replica started again."""

    keeps_weights = False


TEST_MODES = {"logged_object_store": LoggedObjectStore, "forgetful": Forgetful}


@pytest.fixture(autouse=True, scope="module")
def _test_modes():
    """The test's modes registered while this module runs, and only then: another module's config
    (run.async one_step's check names every mode that keeps weights) must not see them."""
    for name, mode in TEST_MODES.items():
        register_weight_sync(name)(mode)
    yield
    for name in TEST_MODES:
        WEIGHT_SYNCS.unregister(name)


def test_the_config_takes_a_registered_mode_and_refuses_an_unknown_one_naming_the_field():
    config = load_config(DEMO, ["models.1.generation.weight_sync=logged_object_store"])
    assert config.models[1].generation.weight_sync == "logged_object_store"
    with pytest.raises(ConfigError, match=r"models.0.generation.weight_sync.*expected one of \[.*'collective'.*"
                                          r"'object_store'.*\] \(got 'carrier_pigeon'\)"):
        load_config(DEMO, ["models.0.generation.weight_sync=carrier_pigeon"])
    # run.async one_step asks the mode whether it keeps the weights a restarted replica needs
    load_config(DEMO, ["run.async=one_step", "models.0.generation.weight_sync=logged_object_store"])
    with pytest.raises(ConfigError, match=r"models.0.generation.weight_sync: run.async: one_step needs "
                                          r"logged_object_store or object_store .* got forgetful"):
        load_config(DEMO, ["run.async=one_step", "models.0.generation.weight_sync=forgetful"])


def test_the_built_in_modes_are_registered_by_their_modules():
    for name in LAZY:
        assert WEIGHT_SYNCS.get(name).name == name
        assert WEIGHT_SYNCS.get(name).keeps_weights == (name in KEEPS_WEIGHTS), name  # the config's copy


def test_no_code_outside_the_modes_branches_on_a_modes_name():
    """A mode's behaviour lives in its class: a comparison with a mode's name elsewhere in the
    driver or the workers is a branch the registry should own."""
    modes = set(LAZY)
    found = []
    for folder in ("orchestrator", "workers"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "weight_sync_modes" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare) and any(
                        isinstance(c, ast.Constant) and c.value in modes for c in [node.left, *node.comparators]):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "\n".join(found)


@pytest.mark.slow
def test_a_registered_mode_carries_a_real_runs_weights(ray_local, tmp_path):
    """Two short runs of the demo pair, the second with llama-char's weights synced by the mode
    registered above: it is asked once per step, and the runs' trajectory stores are equal (the
    second step samples with the weights it delivered)."""
    LoggedObjectStore.log.clear()
    Controller(load_config(DEMO, [*SHORT, f"run.output_dir={tmp_path}", "run.name=plain"])).run()
    Controller(load_config(DEMO, [*SHORT, f"run.output_dir={tmp_path}", "run.name=logged",
                                  "models.0.generation.weight_sync=logged_object_store"])).run()
    assert LoggedObjectStore.log == [("llama-char", None)] * 2
    plain, logged = (sorted(read_store(tmp_path / name), key=lambda r: tuple(r[k] for k in KEY))
                     for name in ("plain", "logged"))
    assert len(plain) > 0 and plain == logged
