"""Where Ray puts ``benchmarks/gpu_check.py``'s actors on a node with GPUs (no GPU needed: Ray
counts GPUs it is told of and assigns them by index, ``ray.get_gpu_ids()``, as on a real node).

Run in a process of its own (``python -m tests.test_gpu_check_placement GPUS``): the instance needs
``num_gpus``, which the session's Ray (``ray_local``) has not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def placed_gpus(gpus: int) -> dict[str, list[list[int]]]:
    """Per model of the check's plan for ``gpus`` GPUs, in the run's order: the GPU ids each of its
    actors (its replica, then its trainer) gets, placed as the run places them (the model's
    placement group of ``model_bundles``, one actor a bundle, models one after the other)."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from benchmarks.gpu_check import config_data, plan
    from orchestrator.cluster.local_ray import local_ray_init_kwargs
    from orchestrator.cluster.placement import model_bundles
    from orchestrator.config import load_config

    @ray.remote
    class Probe:
        def gpu_ids(self) -> list[int]:
            return [int(i) for i in ray.get_gpu_ids()]

    choice, _ = plan("hf", gpus, has_deepspeed=False, has_vllm=False)
    config = load_config(data=config_data(2, 16, Path("runs"), **choice))
    ray.init(**local_ray_init_kwargs(num_cpus=8, num_gpus=gpus))
    try:
        placed = {}
        for model in config.models:
            bundles = model_bundles(model)
            group = placement_group(bundles, strategy=model.placement.upper())
            ray.get(group.ready(), timeout=120)
            probes = [Probe.options(num_cpus=b["CPU"], num_gpus=b.get("GPU", 0),
                                    scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote()
                      for i, b in enumerate(bundles)]
            placed[model.name] = ray.get([p.gpu_ids.remote() for p in probes], timeout=120)
        return placed
    finally:
        ray.shutdown()


def test_the_gpu_checks_nccl_sync_pairs_two_gpus_on_a_node_with_two():
    """On a node with two GPUs, qwen2-bpe's trainer and replica get GPUs of their own, so its
    collective sync runs over NCCL (the part of the check no other part runs into a vLLM engine).
    At a quarter of a GPU each, Ray put all four actors on GPU 0 (it packs fractional shares onto
    a GPU that has room), so the sync turned to the object store on any node, a warning in the log."""
    out = subprocess.run([sys.executable, "-m", "tests.test_gpu_check_placement", "2"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    placed = json.loads(out.stdout.strip().splitlines()[-1])
    replica, trainer = placed["qwen2-bpe"]
    assert len(replica) == 1 and len(trainer) == 1 and replica != trainer, placed


if __name__ == "__main__":
    print(json.dumps(placed_gpus(int(sys.argv[1]))))
