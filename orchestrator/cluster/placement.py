"""The Ray instance a job runs on: the cluster it is given (``ray.address``, ``RAY_ADDRESS``, or
the one ``ray job submit`` runs it on) or a local one bound to 127.0.0.1, and whether it has the
CPUs the job's actors ask for."""

from __future__ import annotations

import math
import os

import ray

from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.config import Config

VERIFIER_CPUS = 0.25


def cpus_needed(config: Config) -> float:
    """Logical CPUs the job's actors ask for: every model's bundles plus the verifier pool."""
    models = sum(m.generation.num_cpus * m.generation.replicas + m.trainer.num_cpus * m.trainer.workers
                 for m in config.models)
    return models + config.data.verifier_actors * VERIFIER_CPUS


def local_cpus(config: Config) -> int:
    """Logical CPUs for a local instance: the machine's cores, or what the job's actors ask for if
    more (tiny CPU actors mostly wait on each other, and fewer slots would leave some unscheduled)."""
    return config.ray.num_cpus or max(os.cpu_count() or 1, math.ceil(cpus_needed(config)))


def init_ray(config: Config) -> bool:
    """Connect to a cluster (config, RAY_ADDRESS, or `ray job submit`) or start a local one
    bound to 127.0.0.1. Returns True when this call started Ray (and should stop it).

    A local instance gets :func:`local_cpus`.
    """
    started = False
    if not ray.is_initialized():
        address = config.ray.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(**local_ray_init_kwargs(num_cpus=local_cpus(config)), log_to_driver=False)
            started = True
    have, need = ray.cluster_resources().get("CPU", 0.0), cpus_needed(config)
    if have < need:  # fail now, rather than leave actors pending forever
        if started:
            ray.shutdown()
        raise RuntimeError(
            f"the Ray cluster has {have:g} CPUs but the job's actors ask for {need:g}: lower "
            "models[].generation.num_cpus / models[].trainer.num_cpus / data.verifier_actors, "
            "or give Ray more (ray.num_cpus for a local instance)")
    return started
