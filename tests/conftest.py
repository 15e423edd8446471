"""Shared fixtures.

``ray_local``: one small local Ray instance for the whole test session, so that each module
that needs Ray does not pay the several seconds of start-up again. If a session is already
initialised (a caller started one), it is reused and left running.

The instance comes from :func:`orchestrator.cluster.local_ray.local_ray_init_kwargs`: ``address="local"``
forces a fresh instance (with ``address=None`` Ray would attach to any cluster recorded in
/tmp/ray by a ``ray start`` on this machine, where ``num_cpus`` is not allowed), and Ray's
single-machine mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``) keeps the node IP at 127.0.0.1,
so that the GCS, raylet, workers and agents listen on loopback only. Token authentication
stays on (Ray's default); tests/test_raylocal.py checks both.

``GRAFTPOOL_TEST_CPU=FILE``: each test's CPU seconds appended to FILE (``tests/cpu_accounting.py``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest


def pytest_configure(config) -> None:
    if os.environ.get("GRAFTPOOL_TEST_CPU"):  # issue #54: where the suite's CPU goes, test by test
        from tests.cpu_accounting import CpuAccount

        config.pluginmanager.register(CpuAccount(Path(os.environ["GRAFTPOOL_TEST_CPU"])), "graftpool-cpu-account")


@pytest.fixture(scope="session")
def ray_local() -> Iterator[ModuleType]:
    import ray

    from orchestrator.cluster.local_ray import local_ray_init_kwargs

    if ray.is_initialized():
        yield ray
        return
    ray.init(**local_ray_init_kwargs(num_cpus=8))  # logical: the 3-model pool asks for 3.5
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def demo_reference(tmp_path_factory, ray_local) -> Path:
    """The demo pair's uninterrupted reference run (``tests/reference_run.py``), run once for
    every test that interrupts the same run and compares the end (``tests/test_faults.py``)."""
    from tests.reference_run import run_reference

    return run_reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="session")
def graft_pair_run(tmp_path_factory, ray_local) -> Path:
    """The demo pair's 2-step graft run (``tests/shared_runs.py``), run once for the tests that
    read it as it is: tests/test_routing_transfer.py's graft preset, tests/test_gate_kinds.py's
    default gate kind."""
    from tests.shared_runs import graft_pair_run

    return graft_pair_run(tmp_path_factory.mktemp("graft-pair"))


@pytest.fixture(scope="module")
def paths() -> dict[str, Path]:
    """The demo pair's tiny models (built once into .cache)."""
    from orchestrator.config import load_config
    from orchestrator.models import resolve_model_path

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml")
    return {m.name: resolve_model_path(m) for m in config.models}


@pytest.fixture(scope="module")
def rollouts(paths):
    """Real samples of both models on the same prompts, scored by the exact verifier."""
    import numpy as np
    import torch

    from graftpool.tasks import generate_problems
    from tests.tiny_pair import build_groups
    from workers.rollout.generation import HFGeneration, SamplingParams
    from workers.verify.verifier import make_verifier

    torch.manual_seed(0)
    problems = generate_problems(["add", "sub", "mod", "digits"], 12, seed=5, split="train")
    verifier = make_verifier("exact")
    groups = {}
    for name, path in paths.items():
        completions = HFGeneration(path).generate([p.prompt for p in problems], SamplingParams(n=4, max_new_tokens=32))
        rewards = np.array([[verifier.verify(t, p.answer).reward for t in c.responses]
                            for p, c in zip(problems, completions, strict=True)])
        groups[name] = build_groups(name, problems, completions, rewards, [[""] * 4 for _ in problems])
    return problems, groups


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """With ``--dist loadscope`` (``make test``: two workers), tests that share a run go to one
    worker and the heaviest units start first (``tests/xdist_units.py``)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.xdist_units import SharedRunScheduling

    return SharedRunScheduling(config, log)


@pytest.fixture(scope="module")
def math_verifier():
    """A MathVerifier with the tests' short timeout (tests/math_answers.py), its child started
    outside any timed section; one per test module."""
    from tests.math_answers import TIMEOUT_S
    from workers.verify.math_verifier import MathVerifier

    verifier = MathVerifier(timeout_s=TIMEOUT_S)
    verifier.verify(r"\boxed{1/2}", "0.5")
    yield verifier
    verifier.close()


@pytest.fixture(scope="module")
def h64_path() -> Path:
    """The scale tests' model (``tests/scale_setup.py``): the mixed pool's vLLM model."""
    from tests.scale_setup import mixed_vllm_model_path

    return mixed_vllm_model_path()


@pytest.fixture(scope="module")
def h64_groups(h64_path):
    """The scale tests' batch: two rollout groups of ``h64_path``'s own samples, mixed rewards."""
    from tests.scale_setup import mixed_rollout_groups

    return mixed_rollout_groups(h64_path)
