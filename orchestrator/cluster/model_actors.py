"""Start the Ray actors of one model: generation replicas and data-parallel trainer ranks.

Each model gets its own placement group (one bundle per actor), so the models' actors
are scheduled together and models run concurrently where the cluster has room.
``models[].placement``: ``pack`` (Ray's PACK: as few nodes as possible) or ``spread``
(SPREAD: the model's actors over as many nodes as possible). A model's trainer ranks meet at
rank 0's node (:func:`join_process_group`), so they may sit on different nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.cluster.actor_calls import Pending, call, get_all
from orchestrator.cluster.model_shipping import ModelShipment, group_nodes
from orchestrator.cluster.placement import model_bundles, wait_until_placed
from orchestrator.cluster.weight_sync_modes.base import WeightSync
from orchestrator.config import AlgorithmConfig, ExchangeConfig, ModelConfig
from orchestrator.config.weight_syncs import WEIGHT_SYNCS
from workers.dispatch import RANK_MODES, REPLICA_MODES
from workers.model_files import ModelSource
from workers.precision import deepspeed_bf16, resolve_generation_dtype, resolve_sync_dtype
from workers.rollout.generation import GenerationWorker
from workers.rollout.settings import GenerationSettings
from workers.training.settings import TrainerSettings
from workers.training.trainer import TorchTrainer, trainer_class

P = ParamSpec("P")


def join_process_group(trainers: list, trainer_cls: type = TorchTrainer) -> None:
    """The model's data-parallel ranks meet at rank 0's node IP and a port free there (not the
    driver's: ranks may be on other nodes); NCCL on GPU, gloo on CPU (the trainer's choice)."""
    if not trainers:
        return
    host, port = call(trainer_cls, trainers, RANK_MODES, TorchTrainer.rendezvous, (), {}).get()
    get_all(call(trainer_cls, trainers, RANK_MODES, TorchTrainer.init_process_group, (port, host), {}).refs)


@dataclass
class ModelActors:
    """One model's actors, and what it takes to start each of them again (same arguments,
    same placement-group bundle) when one dies. Every call on them goes through :meth:`on_trainers`,
    :meth:`on_replicas` or :meth:`on_replicas_at` (``orchestrator.cluster.actor_calls``)."""

    name: str
    generators: list
    trainers: list
    group: object
    spawn_generator: Callable[[int], object] | None = None
    spawn_trainer: Callable[[int], object] | None = None
    trainer_cls: type = TorchTrainer  # the trainer backend's class: its methods declare their dispatch
    weight_sync: InitVar[str] = "object_store"  # models[].generation.weight_sync, a name in WEIGHT_SYNCS
    sync_bucket_mb: float = 256.0
    sync_backend: str = "gloo"  # nccl when the trainer and the replicas are on GPUs
    joined: bool = False  # the trainer ranks formed their process group
    forming: bool = False  # the trainer ranks are forming it (a death then takes every rank)
    # the weight sync mode's instance (its state: last sync, open group); its name: ``sync.name``
    sync: WeightSync = field(init=False)

    def __post_init__(self, weight_sync: str) -> None:
        self.switch_weight_sync(weight_sync)

    def switch_weight_sync(self, name: str) -> None:
        """The model's weights go by mode ``name`` from now on (a fresh instance of it)."""
        self.sync = WEIGHT_SYNCS.get(name)()

    def on_trainers(self, method: Callable[Concatenate[Any, P], Any], *args: P.args, **kwargs: P.kwargs) -> Pending:
        """``method`` (a trainer method, by reference: ``TorchTrainer.score``) on the model's
        data-parallel ranks, spread and collected as it declares (``workers.dispatch``): ``ALL_RANKS``
        and ``EACH_RANK`` put each argument into the object store once for every rank."""
        return call(self.trainer_cls, self.trainers, RANK_MODES, method, args, kwargs)

    def on_replicas(self, method: Callable[Concatenate[Any, P], Any], *args: P.args, **kwargs: P.kwargs) -> Pending:
        """``method`` (a ``GenerationWorker`` method, by reference) on every generation replica, as it
        declares: ``SPLIT`` cuts the list arguments over the replicas and concatenates their records;
        ``SCATTER`` gives replica i item i of each list argument."""
        return self.on_replicas_at(None, method, *args, **kwargs)

    def on_replicas_at(self, indices: list[int] | None, method: Callable[Concatenate[Any, P], Any],
                       *args: P.args, **kwargs: P.kwargs) -> Pending:
        """:meth:`on_replicas` on the replicas at ``indices`` alone (None: every one), e.g. replicas
        just started again."""
        targets = self.generators if indices is None else [self.generators[i] for i in indices]
        return call(GenerationWorker, targets, REPLICA_MODES, method, args, kwargs)

    def sync_weights(self, only: list[int] | None = None) -> list[ray.ObjectRef]:
        """Trainer -> generation, as ``models[].generation.weight_sync`` says
        (``orchestrator.cluster.weight_sync_modes``); ``only``: those replicas (a mode that
        broadcasts covers them all). Returns the calls in flight."""
        return self.sync.sync(self, only)

    def reload_synced(self, indices: list[int]) -> list[ray.ObjectRef]:
        """Replicas ``indices``, started again, get the weights the others hold (the mode's
        :meth:`~orchestrator.cluster.weight_sync_modes.base.WeightSync.reload`)."""
        return self.sync.reload(self, indices)

    def nodes(self) -> dict[str, list[str]]:
        """The Ray node id of each replica and each trainer rank, in order."""
        return {"generation": self.on_replicas(GenerationWorker.node_id).get(),
                "trainers": self.on_trainers(TorchTrainer.node_id).get() if self.trainers else []}

    def rng_states(self) -> list:
        """Each generation replica's torch RNG state (what sampling draws from)."""
        return self.on_replicas(GenerationWorker.get_rng_state).get()

    def set_rng_states(self, states: list, indices: list[int] | None = None) -> list[ray.ObjectRef]:
        """Replica i (of ``indices``; None: every one) gets ``states[i]``."""
        return self.on_replicas_at(indices, GenerationWorker.set_rng_state, states).refs

    def join(self) -> None:
        """The trainer ranks form their process group (once; again after :meth:`restart_trainers`),
        once every rank has answered: a rank dead before the group forms is noticed while its
        peers wait in nothing, so that it alone is started again."""
        if not self.joined:
            self.on_trainers(TorchTrainer.node_id).get()
            self.forming = True
            join_process_group(self.trainers, self.trainer_cls)
            self.joined, self.forming = True, False

    def lost_with(self, index: int) -> list[int]:
        """The replicas to start again when replica ``index`` dies (the weight sync mode's answer:
        itself, or with a sync group begun, every replica of the group)."""
        return self.sync.lost_with(self, index)

    def restart_generator(self, index: int) -> object:
        """A new replica ``index`` on its bundle; the caller gives it weights and RNG state."""
        ray.kill(self.generators[index])  # a no-op when dead
        self.generators[index] = self.spawn_generator(index)
        self.sync.restarted()
        return self.generators[index]

    def restart_trainers(self, rank: int | None = None, join: bool = True) -> list[int]:
        """Rank ``rank`` again where its peers have not begun to form their process group (at
        start-up: they wait in nothing), else every rank (survivors of a group that lost a rank may
        be stuck in a collective), then (``join``) the group formed; the caller loads a checkpoint.
        Returns the ranks started again."""
        ranks = [rank] if rank is not None and not (self.joined or self.forming) else list(range(len(self.trainers)))
        for r in ranks:
            ray.kill(self.trainers[r])
            self.trainers[r] = self.spawn_trainer(r)
        self.joined = self.forming = False
        self.sync.restarted()
        if join:
            self.join()
        return ranks

    def shutdown(self) -> None:
        for actor in [*self.generators, *self.trainers]:
            ray.kill(actor)
        remove_placement_group(self.group)


def threads_for(model_cpus: float, concurrent: int, configured: int = 0) -> int:
    """torch threads of one actor: ``configured`` when set (> 0), else the model's whole CPU
    reservation shared by the actors that work at the same time.

    In a synchronous step a model's generation replicas work together, then (after the
    verifier) its trainer ranks; the two never compute at once. So each phase's actors can use
    every core of the model's placement group, ``floor(model_cpus / concurrent)`` threads each
    (at least 1), without fighting each other; different models reserve different cores and
    run concurrently. With ``run.async: one_step`` on CPU generation and training overlap on the
    same cores (:func:`shares_cores`): the trainer ranks still take the whole reservation (the
    update is the step's critical path) and the replicas' ``concurrent`` counts both kinds (the
    caller's), the actors then sharing the cores
    with :data:`SHARED_CORES_ENV` and the replicas niced (:func:`generation_nice`). With the
    defaults (0.5 + 0.5 CPUs per model) every actor has 1 thread either way."""
    if configured > 0:
        return configured
    return max(1, math.floor(model_cpus / max(concurrent, 1) + 1e-9))


OVERLAP_NICE = 10
"""The replicas' niceness under ``run.async: one_step`` on CPU (``models[].generation.nice: null``)."""

SHARED_CORES_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""The environment of a model's actors when they compute at once on shared cores
(:func:`shares_cores`)."""


def shares_cores(overlapped: bool, with_trainer: bool, generation_gpus: float, trainer_gpus: float) -> bool:
    """Whether a model's replicas and trainer ranks compute at once on the same CPU cores:
    ``run.async: one_step`` with trainer ranks (not an evaluation-only start) and neither on a
    GPU. Where one of them is on a GPU the update does not need the cores the replicas sample on,
    so the layout of a synchronous run is kept."""
    return overlapped and with_trainer and not (generation_gpus or trainer_gpus)


def generation_nice(configured: int | None, shared_cores: bool) -> int:
    """The replicas' CPU niceness: ``configured`` when set, else :data:`OVERLAP_NICE` where they
    share the cores with the update (:func:`shares_cores`: the update, the step's critical path,
    then takes the cores first and sampling fills what it leaves), else 0 (left alone)."""
    if configured is not None:
        return configured
    return OVERLAP_NICE if shared_cores else 0


def trainer_settings(cfg: ModelConfig, algo: AlgorithmConfig, exchange: ExchangeConfig, seed: int,
                     lora: dict | None, sync_dtype: str, num_threads: int, overlapped: bool = False) -> TrainerSettings:
    """A trainer rank's settings: the config's own sections (the model's, its trainer's, the run's
    ``algorithm`` and ``exchange``), each field as configured, and what the driver derives
    (``overlapped``: ``run.async: one_step``)."""
    return TrainerSettings.of(
        cfg, cfg.trainer, algo, exchange, num_threads=num_threads, world_size=cfg.trainer.workers,
        device="cuda" if cfg.trainer.num_gpus else "cpu", lora=lora, sync_dtype=sync_dtype, overlapped=overlapped,
        seed=seed)


def generation_settings(cfg: ModelConfig, path: str | ModelSource, num_threads: int, nice: int,
                        lora: dict | None) -> GenerationSettings:
    """A generation replica's settings: the config's own sections (the model's and its
    ``generation``), each field as configured, and what the driver derives (its seed is set per
    replica when it is spawned)."""
    gen = cfg.generation
    return GenerationSettings.of(cfg, gen, path=path, num_threads=num_threads, nice=nice, lora=lora,
                                 device="cuda" if gen.num_gpus else "cpu", gpu_share=min(gen.num_gpus, 1.0),
                                 vllm=gen.vllm.resolved(gen.num_gpus))


def spawn_model_actors(cfg: ModelConfig, path: Path, algo: AlgorithmConfig, exchange: ExchangeConfig,
                       seed: int, policy_params: dict | None = None, with_trainer: bool = True,
                       overlapped: bool = False, placement_wait_s: float = 600.0) -> ModelActors:
    """Generation replicas and (unless ``with_trainer`` is False: evaluation only) trainer ranks,
    created but not waited for: each actor process imports torch and loads its model in the
    background, so a caller starting several models spawns them all before it waits on any, and
    then joins each model's trainer ranks (:func:`join_process_group`) before training.

    ``path`` (a folder the driver resolved, or a hub id) reaches each actor as
    ``orchestrator.cluster.model_shipping`` decides for the nodes of the model's placement group
    when the actor starts: the folder itself where they see it, else its files shipped."""
    gen, tr = cfg.generation, cfg.trainer
    num_trainers = tr.workers if with_trainer else 0
    bundles = model_bundles(cfg, with_trainer)  # the replicas', then the trainer ranks'
    gen_bundle, trainer_bundle = bundles[0], model_bundles(cfg)[-1]
    model_cpus = sum(b["CPU"] for b in bundles)
    group = placement_group(bundles, strategy=cfg.placement.upper(), name=f"graftpool-{cfg.name}")
    wait_until_placed(group, bundles, cfg.name, placement_wait_s)  # ray.wait_for_resources_s
    shipment = ModelShipment(path)

    shared = shares_cores(overlapped, with_trainer, gen.num_gpus, tr.num_gpus)
    env = {"runtime_env": {"env_vars": dict(SHARED_CORES_ENV)}} if shared else {}

    def on(bundle: int, resources: dict[str, float]):
        return {"num_cpus": resources["CPU"], "num_gpus": resources.get("GPU", 0),
                "scheduling_strategy": PlacementGroupSchedulingStrategy(group, bundle), **env}

    # the replicas' device decides gen.dtype's auto; the trainer sends hf replicas their dtype, vllm
    # replicas its compute dtype (generation.sync_dtype; they load it into their own vllm.dtype)
    gen_device = "cuda" if gen.num_gpus else "cpu"
    gen_dtype = resolve_generation_dtype(gen.dtype, gen_device)
    sync_dtype = gen_dtype if gen.backend == "hf" else resolve_sync_dtype(
        gen.sync_dtype, tr.precision, "cuda" if tr.num_gpus else "cpu", gen.vllm.dtype,
        deepspeed_bf16(tr.precision, tr.deepspeed.bf16) if tr.backend == "deepspeed" else None)
    generator_cls = ray.remote(GenerationWorker)
    # an evaluation (no trainer) never imports the trainer backend: its package need not be here
    trainer_backend = trainer_class(tr.backend) if with_trainer else TorchTrainer
    trainer_cls = ray.remote(trainer_backend)
    # LoRA (workers.lora): the trainer ranks and the replicas inject the same adapters (one
    # init seed for the model), and weight syncs carry the adapter weights only
    lora = None if cfg.lora is None else {**cfg.lora.model_dump(), "init_seed": seed}
    # the update keeps the model's cores in either mode (with run.async one_step it is the step's
    # critical path); replicas that share them with it get a share as if all the actors split them
    sharing = gen.replicas + tr.workers if shared else 0
    settings = trainer_settings(cfg, algo, exchange, seed, lora, sync_dtype,
                                threads_for(model_cpus, tr.workers, tr.num_threads), overlapped)
    settings = settings.with_changes(**(policy_params or {}))  # what the exchange policy asks of every rank
    generation = generation_settings(cfg, shipment.path, threads_for(model_cpus, sharing or gen.replicas, gen.num_threads),
                                     generation_nice(gen.nice, shared), lora)

    def spawn_generator(i: int):
        source = shipment.source_for(group_nodes(group))  # on a restart, perhaps on a new node
        return generator_cls.options(**on(i, gen_bundle)).remote(
            generation.with_changes(seed=seed + 1000 * i, path=source), cfg.name)

    def spawn_trainer(r: int):
        source = shipment.source_for(group_nodes(group))
        return trainer_cls.options(**on(gen.replicas + r, trainer_bundle)).remote(source, settings, r)

    generators = [spawn_generator(i) for i in range(gen.replicas)]
    trainers = [spawn_trainer(r) for r in range(num_trainers)]
    on_gpus = bool(gen.num_gpus and tr.num_gpus)
    return ModelActors(cfg.name, generators, trainers, group, spawn_generator, spawn_trainer, trainer_backend,
                       weight_sync=gen.weight_sync if with_trainer else "object_store",
                       sync_bucket_mb=gen.sync_bucket_mb, sync_backend="nccl" if on_gpus else "gloo")
