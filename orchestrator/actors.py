"""Start the Ray actors of one model: generation replicas and data-parallel trainer ranks.

Each model gets its own placement group (one bundle per actor), so the models' actors
are scheduled together and models run concurrently where the cluster has room.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.config import AlgorithmConfig, ModelConfig
from workers.generation import Completion, GenerationWorker, SamplingParams
from workers.trainer import TorchTrainer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ModelActors:
    name: str
    generators: list
    trainers: list
    group: object

    def generate(self, prompts: list[str], params: SamplingParams) -> list[ray.ObjectRef]:
        """Split the prompts over the replicas; returns one ref per replica, in order."""
        per = -(-len(prompts) // len(self.generators))
        return [g.generate.remote(prompts[i * per:(i + 1) * per], params)
                for i, g in enumerate(self.generators) if prompts[i * per:(i + 1) * per]]

    @staticmethod
    def gather(refs: list[ray.ObjectRef]) -> list[Completion]:
        return [c for part in ray.get(refs) for c in part]

    def call_trainers(self, method: str, *args) -> list[ray.ObjectRef]:
        """The same call on every data-parallel rank (rank 0's result is the model's)."""
        return [getattr(t, method).remote(*args) for t in self.trainers]

    def sync_weights(self) -> list[ray.ObjectRef]:
        """Trainer -> generation, as an object ref that never passes through the driver."""
        weights = self.trainers[0].state_dict.remote()
        version = self.trainers[0].get_version.remote()
        return [g.load_weights.remote(weights, version) for g in self.generators]

    def shutdown(self) -> None:
        for actor in [*self.generators, *self.trainers]:
            ray.kill(actor)
        remove_placement_group(self.group)


def start_model_actors(cfg: ModelConfig, path: Path, algo: AlgorithmConfig, seed: int,
                       sgt_coef: float = 0.1, with_trainer: bool = True) -> ModelActors:
    """Generation replicas and (unless ``with_trainer`` is False: evaluation only) trainer ranks."""
    gen, tr = cfg.generation, cfg.trainer
    num_trainers = tr.workers if with_trainer else 0
    if gen.backend != "hf":
        raise ValueError(f"models[{cfg.name}].generation.backend: '{gen.backend}' is not available "
                         "in this build; use 'hf'")
    if tr.backend != "torch":
        raise ValueError(f"models[{cfg.name}].trainer.backend: '{tr.backend}' is not available "
                         "in this build; use 'torch'")
    bundles = [{"CPU": gen.num_cpus}] * gen.replicas + [{"CPU": tr.num_cpus}] * num_trainers
    group = placement_group(bundles, strategy="PACK", name=f"graftpool-{cfg.name}")
    ray.get(group.ready(), timeout=120)

    def on(bundle: int, cpus: float):
        return {"num_cpus": cpus, "scheduling_strategy": PlacementGroupSchedulingStrategy(group, bundle)}

    generator_cls = ray.remote(GenerationWorker)
    generators = [
        generator_cls.options(**on(i, gen.num_cpus)).remote(
            "hf", seed=seed + 1000 * i, path=str(path), batch_size=gen.batch_size,
            trust_remote_code=cfg.trust_remote_code)
        for i in range(gen.replicas)
    ]
    trainer_cls = ray.remote(TorchTrainer)
    trainer_kwargs = dict(
        lr=tr.lr, betas=tr.betas, weight_decay=tr.weight_decay, grad_clip=tr.grad_clip,
        eps_low=algo.eps_low, eps_high=algo.eps_high, delta=algo.delta, minibatches=algo.minibatches,
        epochs=algo.epochs, peer_last=algo.peer_last, gate=algo.gate, sgt_coef=sgt_coef, seed=seed,
        trust_remote_code=cfg.trust_remote_code, world_size=tr.workers)
    trainers = [
        trainer_cls.options(**on(gen.replicas + r, tr.num_cpus)).remote(str(path), rank=r, **trainer_kwargs)
        for r in range(num_trainers)
    ]
    port = free_port()
    ray.get([t.init_process_group.remote(port) for t in trainers])
    return ModelActors(cfg.name, generators, trainers, group)
