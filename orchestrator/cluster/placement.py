"""The Ray instance a job runs on: the cluster it is given (``ray.address``, ``RAY_ADDRESS``, or
the one ``ray job submit`` runs it on) or a local one bound to 127.0.0.1, and whether it holds
the bundles the job's actors ask for (CPUs, GPUs, custom resources).

A local instance has no autoscaler, so a shortfall fails at once. On a cluster the job waits
for the autoscaler to add the nodes (:func:`orchestrator.cluster.autoscale.wait_for_bundles`).
"""

from __future__ import annotations

import math
import os
from collections import Counter

import ray

from orchestrator.cluster.autoscale import Bundle, describe, wait_for_bundles
from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.config import Config, ModelConfig

VERIFIER_CPUS = 0.25
PLACEMENT_GRACE_S = 30.0
"""The least time a placement group is given to form, even with ``ray.wait_for_resources_s`` 0."""


def model_bundles(cfg: ModelConfig, with_trainer: bool = True) -> list[Bundle]:
    """One model's placement-group bundles, one an actor: its generation replicas', then (unless
    ``with_trainer`` is False) its trainer ranks'. A replica reserves ``num_gpus`` GPUs (vllm's
    ``tensor_parallel_size`` is 1: larger is refused at load); ``resources`` adds custom resources."""
    gen, tr = cfg.generation, cfg.trainer
    gen_bundle = {"CPU": gen.num_cpus, **({"GPU": gen.num_gpus} if gen.num_gpus else {}), **gen.resources}
    trainer_bundle = {"CPU": tr.num_cpus, **({"GPU": tr.num_gpus} if tr.num_gpus else {}), **tr.resources}
    return [gen_bundle] * gen.replicas + [trainer_bundle] * (tr.workers if with_trainer else 0)


def job_bundles(config: Config, with_trainer: bool = True) -> list[Bundle]:
    """Every bundle the job's actors ask for: each model's (:func:`model_bundles`) and one
    ``{"CPU": VERIFIER_CPUS}`` a verifier actor."""
    return [*(b for m in config.models for b in model_bundles(m, with_trainer)),
            *[{"CPU": VERIFIER_CPUS}] * config.data.verifier_actors]


def totals(bundles: list[Bundle]) -> dict[str, float]:
    """The bundles' resources summed, resource by resource."""
    out: Counter[str] = Counter()
    for bundle in bundles:
        out.update(bundle)
    return dict(out)


def cpus_needed(config: Config) -> float:
    """Logical CPUs the job's actors ask for: every model's bundles plus the verifier pool."""
    return totals(job_bundles(config)).get("CPU", 0.0)


def local_cpus(config: Config) -> int:
    """Logical CPUs for a local instance: the machine's cores, or what the job's actors ask for if
    more (tiny CPU actors mostly wait on each other, and fewer slots would leave some unscheduled)."""
    return config.ray.num_cpus or max(os.cpu_count() or 1, math.ceil(cpus_needed(config)))


def check_local(have: dict[str, float], bundles: list[Bundle]) -> None:
    """A local instance (no autoscaler) must already have, resource by resource, what the
    bundles ask for; else fail now, rather than leave actors pending forever."""
    need = totals(bundles)
    short = {k: v for k, v in need.items() if have.get(k, 0.0) < v}
    if not short:
        return
    said = ", ".join(f"{have.get(k, 0.0):g} {k} (asked: {v:g})" for k, v in short.items())
    hint = ("lower models[].generation.num_cpus / models[].trainer.num_cpus / data.verifier_actors, "
            "or give Ray more (ray.num_cpus for a local instance)") if "CPU" in short else \
        ("lower models[].generation.num_gpus / models[].trainer.num_gpus / their resources, or run on a "
         "cluster that has them (ray.address)")
    raise RuntimeError(f"the local Ray instance has {said}: the job's actors ask for {describe(bundles)}; {hint}")


def init_ray(config: Config, with_trainer: bool = True) -> bool:
    """Connect to a cluster (config, RAY_ADDRESS, or `ray job submit`) or start a local one
    bound to 127.0.0.1. Returns True when this call started Ray (and should stop it).

    A local instance gets :func:`local_cpus` and must hold the job's bundles at once
    (:func:`check_local`); on a cluster the job waits up to ``ray.wait_for_resources_s`` for the
    autoscaler to add what they need (:func:`wait_for_bundles`). ``with_trainer`` False: an
    evaluation-only start, without the trainer ranks' bundles.
    """
    started = False
    if not ray.is_initialized():
        address = config.ray.address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(**local_ray_init_kwargs(num_cpus=local_cpus(config)), log_to_driver=False)
            started = True
    bundles = job_bundles(config, with_trainer)
    try:
        if started:
            check_local(ray.cluster_resources(), bundles)
        else:
            wait_for_bundles(bundles, config.ray.wait_for_resources_s)
    except Exception:
        if started:
            ray.shutdown()
        raise
    return started


def wait_until_placed(group, bundles: list[Bundle], model: str, timeout_s: float) -> None:
    """Wait for one model's placement group, up to max(``timeout_s``, :data:`PLACEMENT_GRACE_S`)
    (``timeout_s``: ``ray.wait_for_resources_s``). :func:`init_ray` waited for nodes whose *total*
    resources hold the job's bundles; the group also needs them *free* (another job or a
    ``graftpool serve`` may hold a GPU node), and a pending group is a demand Ray's autoscaler
    adds nodes for, which takes minutes on a cloud. On time-out the group is removed and the
    error names the model, its bundles, what is free and the field."""
    from ray.util.placement_group import remove_placement_group

    wait_s = max(timeout_s, PLACEMENT_GRACE_S)
    ready, _ = ray.wait([group.ready()], timeout=wait_s)
    if ready:
        return
    remove_placement_group(group)
    available = ray.available_resources()  # a resource none is left of is not listed
    free = {k: available.get(k, 0.0) for k in {"CPU", "GPU", *totals(bundles)}}
    raise RuntimeError(
        f"model {model}: its placement group ({describe(bundles)}) was not placed within {wait_s:g} s: the cluster's "
        f"free resources are {', '.join(f'{k} {v:g}' for k, v in sorted(free.items()))} (other jobs or "
        "a `graftpool serve` may hold the rest); raise ray.wait_for_resources_s to wait longer for the autoscaler, "
        "or free the resources")
