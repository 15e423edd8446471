"""The split of the main suite between two xdist workers (``tests/xdist_units.py``): tests that
share a module's run stay together, the listed ones stand alone, and every name it lists still
names a test (a renamed test would otherwise quietly change the split)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import pytest

pytest.importorskip("xdist")

from tests.xdist_units import INDEPENDENT, SECONDS, SHARES_REFERENCE, SHARES_RUN, unit_of, weight_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def _tests_of(module: str) -> dict[str, inspect.Signature]:
    mod = importlib.import_module(module.removesuffix(".py").replace("/", "."))
    return {name: inspect.signature(fn) for name, fn in vars(mod).items()
            if name.startswith("test_") and callable(fn)}


def test_a_module_is_one_unit_but_for_its_independent_tests():
    assert unit_of("tests/test_platform.py::test_pair_run_is_in_mlflow") == "tests/test_platform.py"
    assert unit_of("tests/test_platform.py::test_serve_and_eval_answer_openai_clients_and_score_alike") \
        == "tests/test_platform.py"
    ablation = "tests/test_platform.py::test_graft_ablations_reach_the_store[success-group]"
    assert unit_of(ablation) == ablation
    assert unit_of("tests/test_faults.py::test_killed_generation_verifier_and_trainer_actors_are_survived_exactly") \
        == "tests/test_faults.py"
    assert unit_of("tests/test_graft.py::test_x") == "tests/test_graft.py"


def test_every_module_that_takes_the_demo_reference_shares_test_faults_unit():
    """``demo_reference`` is one run per worker process: every module whose tests take it runs
    on test_faults.py's worker (one reference run for the suite)."""
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        module = f"tests/{path.name}"
        takers = [name for name, sig in _tests_of(module).items() if "demo_reference" in sig.parameters]
        for name in takers:
            assert unit_of(f"{module}::{name}") == "tests/test_faults.py", (module, name)


def test_independent_tests_exist_and_use_no_shared_run():
    """A listed test must exist, and must not take its module's shared run: on another worker
    that run would be made a second time."""
    shared = {"demo_reference", "pair_run"}
    for module, prefixes in INDEPENDENT.items():
        tests = _tests_of(module)
        for prefix in prefixes:
            named = [name for name in tests if name.startswith(prefix)]
            assert named, f"{module}: no test starts with {prefix}"
            for name in named:
                assert not shared & set(tests[name].parameters), (module, name)


def test_every_weighed_unit_exists_and_heavier_units_come_first():
    for key in SECONDS:
        module, _, name = key.partition("::")
        assert (ROOT / module).is_file(), key
        if name:
            assert any(t.startswith(name) for t in _tests_of(module)), key
    units = ["tests/test_graft.py", "tests/test_platform.py::test_hacpo_pair_run_trains_every_peer_group",
             "tests/test_faults.py", "tests/test_platform.py"]
    assert sorted(units, key=lambda u: -weight_of(u)) == [
        "tests/test_faults.py", "tests/test_platform.py",
        "tests/test_platform.py::test_hacpo_pair_run_trains_every_peer_group", "tests/test_graft.py"]
    assert weight_of("tests/test_graft.py") == 0.0


def test_every_module_that_compares_with_the_reference_run_is_one_unit():
    """``demo_reference`` is a session fixture: per xdist worker. Every module whose tests take
    it joins ``tests/test_faults.py``'s unit, so that the reference run is made once."""
    users = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        module = f"tests/{path.name}"
        if "demo_reference" in path.read_text() and any(
                "demo_reference" in sig.parameters for sig in _tests_of(module).values()):
            users.append(module)
    assert {"tests/test_faults.py", "tests/test_startup_faults.py", "tests/test_chaos.py"} <= set(users)
    assert {unit_of(f"{m}::test_x") for m in users} == {"tests/test_faults.py"}
    assert set(SHARES_REFERENCE) <= set(users)


def test_every_module_that_reads_the_graft_pair_run_is_one_unit():
    """``graft_pair_run`` (tests/shared_runs.py) is a session fixture too: the modules that read
    it are one unit, so that the run is made once."""
    users = [f"tests/{path.name}" for path in sorted((ROOT / "tests").glob("test_*.py"))
             if path.name != Path(__file__).name and "graft_pair_run" in path.read_text()]
    assert {"tests/test_routing_transfer.py", "tests/test_gate_kinds.py"} <= set(users)
    assert {unit_of(f"{m}::test_x") for m in users} == {"tests/test_routing_transfer.py"}
    assert set(SHARES_RUN) <= set(users)
