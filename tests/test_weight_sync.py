"""Collective weight sync (``workers/rollout/weight_sync.py``): trainer rank 0 broadcasts to the
generation replicas over a gloo group of their own; real Ray actors and a real tiny model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graftpool.tasks import generate_problems
from orchestrator.cluster.actor_calls import get_all
from orchestrator.cluster.model_actors import ModelActors, join_process_group
from orchestrator.config import load_config
from orchestrator.models import resolve_model_path
from tests.rollouts import sampled_groups
from tests.tiny_pair import batch_of
from workers.rollout.generation import GenerationWorker
from workers.rollout.settings import GenerationSettings
from workers.rollout.weight_sync import make_plan, open_group, rendezvous_address
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent


def test_plan_cuts_buckets_by_size_and_dtype():
    state = {"a": torch.zeros(10), "b": torch.zeros(300), "c": torch.zeros(5, dtype=torch.float16),
             "d": torch.zeros(2)}
    plan = make_plan(state, bucket_mb=1024 / 2**20)  # 1 KiB: 256 float32 values
    assert [[s.name for s in b] for b in plan.buckets] == [["a"], ["b"], ["c"], ["d"]]
    assert make_plan(state, bucket_mb=1.0).buckets[0][1].name == "b"  # a and b share a bucket
    assert plan.nbytes == 4 * 312 + 2 * 5


def test_a_group_whose_member_never_comes_fails_within_its_formation_limit():
    """Rank 0 alone in a group of two: it gives up after the formation limit (a member that
    died before joining must not hold the trainer for the broadcast's ten minutes)."""
    import time

    host, port = rendezvous_address()
    t0 = time.monotonic()
    with pytest.raises(Exception, match="(?i)timeout|timed out"):
        open_group(host, port, 0, 2, timeout_s=2.0)
    assert time.monotonic() - t0 < 60


def test_a_dead_replica_takes_its_sync_group_peers_with_it_only_in_collective_mode():
    replicas = ["r0", "r1", "r2"]
    began = ModelActors("m", replicas, [], None, weight_sync="collective")
    # before the replicas began a sync group (start-up) the dead one alone: its peers wait in nothing
    assert began.lost_with(1) == [1]
    began.sync.begun = True
    assert began.lost_with(1) == [0, 1, 2]
    assert ModelActors("m", replicas, [], None, weight_sync="object_store").lost_with(1) == [1]


@pytest.fixture(scope="module")
def llama(ray_local):
    config = load_config(ROOT / "configs" / "demo_pair.yaml")
    return resolve_model_path(config.models[0])


def test_collective_sync_delivers_the_trainers_exact_weights_to_every_replica(ray_local, llama):
    """Two trainer ranks (rank 0 is the source) and two hf replicas: after an update, one
    collective sync (small buckets: many broadcasts) leaves each replica's weights equal to the
    trainer's bit for bit, and a replica restarted afterwards joins a new group."""
    ray = ray_local
    problems = generate_problems(["add"], 4, seed=3, split="train")
    groups = sampled_groups("llama-char", llama, problems, np.array([[1, 0, 1, 0]] * 4, dtype=float))
    trainer_cls, generator_cls = ray.remote(TorchTrainer), ray.remote(GenerationWorker)
    trainers = [trainer_cls.options(num_cpus=0.25).remote(str(llama), lr=1e-2, minibatches=1, rank=r, world_size=2)
                for r in range(2)]
    join_process_group(trainers)
    generators = [generator_cls.options(num_cpus=0.25).remote(GenerationSettings(path=str(llama), seed=i))
                  for i in range(2)]
    actors = ModelActors("llama-char", generators, trainers, None,
                         spawn_generator=lambda i: generator_cls.options(num_cpus=0.25).remote(
                             GenerationSettings(path=str(llama))),
                         trainer_cls=TorchTrainer, weight_sync="collective", sync_bucket_mb=0.05)
    get_all([t.train.remote(batch_of(groups)) for t in trainers])
    expected = ray.get(trainers[0].state_dict.remote())
    before = ray.get(generators[0].state_dict.remote())
    assert any(not torch.equal(before[k], v) for k, v in expected.items()), "the update changed the weights"

    sent = get_all(actors.sync_weights())
    plan = ray.get(trainers[0].sync_plan.remote(0.05))
    assert len(plan.buckets) > 3 and sent[0] == plan.nbytes and sent[1] == 0  # rank 1 sends nothing
    assert sent[2:] == [1, 1]  # the replicas report the version they loaded
    for generator in actors.generators:
        got = ray.get(generator.state_dict.remote())
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), name

    actors.restart_generator(1)
    assert not actors.sync.open
    get_all(actors.sync_weights([1]))
    assert actors.sync.open
    got = ray.get(actors.generators[1].state_dict.remote())
    assert all(torch.equal(got[name], tensor) for name, tensor in expected.items())
    for actor in [*actors.generators, *trainers]:
        ray.kill(actor)


def test_a_sync_group_over_nccl_refuses_two_members_on_one_gpu():
    """NCCL will not put two ranks of one group on one device ('Duplicate GPU detected'); the
    collective sync checks the members' CUDA device UUIDs first (CPU members: none to clash)."""
    from orchestrator.cluster.weight_sync_modes.collective import shared_gpus

    assert shared_gpus(["GPU-a", "GPU-b", "GPU-a"]) and not shared_gpus(["GPU-a", "GPU-b"])
    assert not shared_gpus(["", "", ""])
