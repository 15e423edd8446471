"""The shared name -> implementation registry behind backends, trainers, verifiers and policies."""

import importlib.util

import pytest

from graftpool.registry import Registry
from workers.rollout.generation import BACKENDS, HFGeneration
from workers.training.trainer import TRAINERS, TorchTrainer


def test_unknown_names_list_registered_and_optional_entries():
    with pytest.raises(ValueError, match=r"models\[\]\.generation\.backend: unknown backend 'tgi'; "
                                         r"expected one of \['hf', 'vllm'\]"):
        BACKENDS.get("tgi")
    with pytest.raises(ValueError, match=r"expected one of \['deepspeed', 'torch'\]"):
        TRAINERS.get("jax")
    assert BACKENDS.get("hf") == HFGeneration.from_settings and TRAINERS.get("torch") is TorchTrainer


def test_a_taken_name_cannot_be_registered_again_by_another_class():
    registry: Registry[type] = Registry("thing", "things.name")

    @registry.register("a")
    class A:
        pass

    assert registry.register("a")(A) is A  # re-registering the same class is harmless
    with pytest.raises(ValueError, match="thing 'a' is already registered"):
        registry.register("a")(type("B", (), {}))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed here")
def test_an_optional_entry_is_imported_on_first_lookup_only():
    """Without the extra, nothing fails until a config asks for it; then the import error says which."""
    with pytest.raises(ModuleNotFoundError, match="deepspeed"):
        TRAINERS.get("deepspeed")
