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


def test_an_entry_the_actors_could_not_import_is_refused_where_it_is_registered(tmp_path, monkeypatch):
    """A run script that registers its own generation backend (``@register_backend``) filled the
    driver's registry, so the config passed at load; each replica looks the name up in its own
    process, which never imports the script, and failed with 'unknown backend' once the cluster had
    started it. Such an entry is refused when it is registered, naming the fix: a module that the
    registry's lazy entries name, which every process imports on its first lookup (accepted)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    (tmp_path / "my_run.py").write_text(
        "from workers.rollout.generation import register_backend\n\n"
        "@register_backend('mine')\ndef mine(settings):\n    return None\n\nprint('registered')\n")
    script = subprocess.run([sys.executable, "my_run.py"], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert script.returncode != 0, script.stdout
    assert ("models[].generation.backend: backend 'mine' is registered by module '__main__', which the "
            "generation replicas do not import") in script.stderr, script.stderr[-2000:]

    # an entry that is an instance (a gate kind wraps its function) is judged by the function's module
    (tmp_path / "my_gate.py").write_text(
        "from workers.receiver.gate_kinds import register_gate_kind\n\n"
        "@register_gate_kind('mine')\ndef mine(g):\n    return None\n")
    gate = subprocess.run([sys.executable, "my_gate.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert "gate kind 'mine' is registered by module '__main__', which the trainer ranks" in gate.stderr, \
        gate.stderr[-2000:]

    # the way the message gives: a module of the working directory, named by a lazy entry
    (tmp_path / "my_backend.py").write_text(
        "from workers.rollout.generation import register_backend\n\n"
        "@register_backend('mine')\ndef mine(settings):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(BACKENDS.lazy, "mine", "my_backend")
    try:
        assert BACKENDS.get("mine").__module__ == "my_backend"
    finally:
        BACKENDS.unregister("mine")
        sys.modules.pop("my_backend", None)
