"""``graftpool serve``'s GPU share per model (``orchestrator.serving.serve.gpus_per_model``) places
every model's deployment: Ray fits a fractional GPU request within one GPU, so the share must
divide a GPU among as many deployments as the GPUs must hold. GPUs / models did not: 3 models on
2 GPUs asked 2/3 each, one GPU could take only one, and the third deployment waited for ever (on an
autoscaling cluster: for a new GPU node of its own)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cluster.local_ray import LOOPBACK_ENV
from orchestrator.serving.serve import gpus_per_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("gpus", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("models", [1, 2, 3, 5, 9])
def test_the_shares_of_every_model_fit_on_the_gpus(gpus: int, models: int):
    share = gpus_per_model(gpus, models)
    per_gpu = int(1 / share + 1e-9)  # deployments of this share one GPU holds
    assert per_gpu * gpus >= models, (gpus, models, share)
    assert share == 1.0 if models <= gpus else share >= 1 / models  # a whole GPU where there are enough


PLACE = """
import ray
from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.serving.serve import gpus_per_model

ray.init(**local_ray_init_kwargs(num_cpus=4, num_gpus=2, log_to_driver=False))
share = gpus_per_model(ray.cluster_resources()["GPU"], 3)

@ray.remote(num_cpus=0)
class Deployment:
    def ready(self) -> bool:
        return True

actors = [Deployment.options(num_gpus=share).remote() for _ in range(3)]
ready, pending = ray.wait([a.ready.remote() for a in actors], num_returns=3, timeout=60)
print(f"share {share:.4f} placed {len(ready)} of 3", flush=True)
"""


@pytest.mark.slow
def test_three_models_deployments_all_place_on_two_gpus():
    """As ``build_app`` asks: each deployment an actor of ``num_gpus=gpus_per_model(...)`` on a
    Ray instance of 2 (logical) GPUs; all three start."""
    env = {**os.environ, **LOOPBACK_ENV, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    out = subprocess.run([sys.executable, "-c", PLACE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "placed 3 of 3" in out.stdout, out.stdout + out.stderr[-1000:]
