"""Start the Ray actors of one model: generation replicas and data-parallel trainer ranks.

Each model gets its own placement group (one bundle per actor), so the models' actors
are scheduled together and models run concurrently where the cluster has room.
``models[].placement``: ``pack`` (Ray's PACK: as few nodes as possible) or ``spread``
(SPREAD: the model's actors over as many nodes as possible). A model's trainer ranks meet at
rank 0's node (:func:`join_process_group`), so they may sit on different nodes.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.exceptions import OutOfMemoryError, RayActorError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from graftpool.step_record import StepRecord
from orchestrator.cluster.model_shipping import ModelShipment, group_nodes
from orchestrator.cluster.placement import model_bundles, wait_until_placed
from orchestrator.config import AlgorithmConfig, ExchangeConfig, ModelConfig
from workers.dispatch import Dispatch, dispatch_of
from workers.model_files import ModelSource
from workers.rollout.generation import GenerationWorker
from workers.rollout.settings import GenerationSettings
from workers.training.precision import deepspeed_bf16, resolve_generation_dtype, resolve_sync_dtype
from workers.training.settings import TrainerSettings
from workers.training.trainer import trainer_class


def join_process_group(trainers: list) -> None:
    """The model's data-parallel ranks meet at rank 0's node IP and a port free there (not the
    driver's: ranks may be on other nodes); NCCL on GPU, gloo on CPU (the trainer's choice)."""
    if not trainers:
        return
    host, port = get_all([trainers[0].rendezvous.remote()])[0]
    get_all([t.init_process_group.remote(port, host) for t in trainers])


# An actor's death, as a call to it reports it: by Ray's error for a dead actor (which names the
# actor), or by the memory monitor's for a worker it killed to free memory (which names none)
DEATHS = (RayActorError, OutOfMemoryError)


def get_all(refs: list[ray.ObjectRef], peer_wait_s: float = 10.0) -> list:
    """``ray.get(refs)`` in order, but raising as soon as any of them fails (a dead
    data-parallel rank must not leave the driver waiting on a peer stuck in all_reduce).

    A rank's death can surface first as another rank's error (gloo: connection closed);
    then the others get ``peer_wait_s`` to report, and an actor death among them is what
    is raised, so that the caller sees which actor died."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready)  # raises the task's error, if any
        except DEATHS:
            raise
        except Exception as first:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=peer_wait_s) if pending else ([], [])
            for ref in done:
                try:
                    ray.get(ref)
                except DEATHS as death:
                    raise death from first
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
            raise
    return ray.get(list(refs))


def shared_gpus(devices: list[str]) -> bool:
    """Whether two of a sync group's members (their CUDA device UUIDs) sit on the same GPU."""
    on_gpu = [d for d in devices if d]
    return len(set(on_gpu)) < len(on_gpu)


@dataclass
class Pending:
    """Calls in flight on a model's actors, and how their results are collected (the method's
    declared :class:`workers.dispatch.Dispatch`). ``get()`` waits (:func:`get_all`) and collects."""

    refs: list[ray.ObjectRef]
    mode: Dispatch

    def get(self):
        results = get_all(self.refs)
        if self.mode in (Dispatch.ALL_RANKS, Dispatch.RANK0):
            return results[0]
        if self.mode == Dispatch.SPLIT:
            return StepRecord.concat(results)
        return results


def split_evenly(args: tuple, parts: int) -> list[tuple]:
    """The list arguments of a ``SPLIT`` call cut into ``parts`` near-equal contiguous slices
    (other arguments whole in each); slices with nothing in them left out."""
    size = next(len(a) for a in args if isinstance(a, list))
    per = -(-size // max(parts, 1))
    out = []
    for i in range(parts):
        lo, hi = i * per, min((i + 1) * per, size)
        if lo < hi:
            out.append(tuple(a[lo:hi] if isinstance(a, list) else a for a in args))
    return out


@dataclass
class ModelActors:
    """One model's actors, and what it takes to start each of them again (same arguments,
    same placement-group bundle) when one dies."""

    name: str
    generators: list
    trainers: list
    group: object
    spawn_generator: Callable[[int], object] | None = None
    spawn_trainer: Callable[[int], object] | None = None
    trainer_cls: type | None = None  # the trainer backend's class: its methods declare their dispatch
    weight_sync: str = "object_store"  # models[].generation.weight_sync
    sync_bucket_mb: float = 256.0
    sync_backend: str = "gloo"  # nccl when the trainer and the replicas are on GPUs
    sync_group_open: bool = False  # collective: the trainer and every current replica joined
    joined: bool = False  # the trainer ranks formed their process group
    forming: bool = False  # the trainer ranks are forming it (a death then takes every rank)
    sync_group_begun: bool = False  # collective: the replicas began a sync group (a death then takes them all)
    synced: tuple[ray.ObjectRef, int] | None = None  # object_store: the weights the replicas hold, and their version

    def on_trainers(self, method: str, *args) -> Pending:
        """A trainer method on the model's data-parallel ranks, spread and collected as the method
        declares (``workers.dispatch``): ``ALL_RANKS`` and ``EACH_RANK`` put each argument into the
        object store once for every rank."""
        return self._call(self.trainer_cls, self.trainers, method, args)

    def on_replicas(self, method: str, *args) -> Pending:
        """A ``GenerationWorker`` method on the model's generation replicas, as it declares:
        ``SPLIT`` cuts the list arguments over the replicas and concatenates their records."""
        return self._call(GenerationWorker, self.generators, method, args)

    @staticmethod
    def _call(cls: type, actors: list, method: str, args: tuple) -> Pending:
        mode = dispatch_of(cls, method)
        if mode == Dispatch.SPLIT:
            return Pending([getattr(a, method).remote(*part) for a, part in
                            zip(actors, split_evenly(args, len(actors)), strict=False)], mode)
        if mode == Dispatch.RANK0:
            return Pending([getattr(actors[0], method).remote(*args)], mode)
        shared = [a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in args] if len(actors) > 1 else args
        return Pending([getattr(a, method).remote(*shared) for a in actors], mode)

    def sync_weights(self, generators: list | None = None) -> list[ray.ObjectRef]:
        """Trainer -> generation. ``object_store``: rank 0's state dict as an object ref that
        never passes through the driver, to each replica (``generators``: only those); the ref
        is kept (:attr:`synced`), so a replica started again later gets the weights its peers
        hold. ``collective``: rank 0 broadcasts in buckets to every replica over their sync
        group (``workers.rollout.weight_sync``), opened on first use and again after any restart."""
        version = self.trainers[0].get_version.remote()
        if self.weight_sync == "collective" and not self.sync_group_open:
            self.open_sync_group()  # on one shared GPU it turns to the object store instead
        if self.weight_sync == "collective":
            return [*self.on_trainers("broadcast_weights").refs, *(g.receive_weights.remote(version)
                                                           for g in self.generators)]
        gathered = self.on_trainers("weights_for_sync").refs  # every rank: ZeRO-3 gathers collectively
        self.synced = (gathered[0], version)
        return [*gathered[1:], *(g.load_weights.remote(gathered[0], version) for g in (generators or self.generators))]

    def reload_synced(self, generators: list) -> list[ray.ObjectRef]:
        """Replicas started again get the weights the others hold: the last object-store sync's
        (none before the first sync: the model's own weights, which they loaded), or with the
        collective sync, a new sync of the trainer's weights."""
        if self.weight_sync == "collective":
            return self.sync_weights(generators)
        if self.synced is None:
            return []
        weights, version = self.synced
        return [g.load_weights.remote(weights, version) for g in generators]

    def nodes(self) -> dict[str, list[str]]:
        """The Ray node id of each replica and each trainer rank, in order."""
        return {"generation": self.on_replicas("node_id").get(),
                "trainers": self.on_trainers("node_id").get() if self.trainers else []}

    def open_sync_group(self) -> None:
        """Trainer rank 0 (the source, rank 0, hosting the group at its node) and the replicas
        (ranks 1..R) join one process group for weight broadcasts. Every replica answers first
        (a new one has finished its ``__init__``, a dead one is noticed), so that none of the
        others waits in the group's formation for a member that cannot come
        (``workers.rollout.weight_sync.RENDEZVOUS_S``)."""
        get_all([g.version.remote() for g in self.generators])
        self.sync_group_begun = True
        if self.sync_backend == "nccl":
            devices = [*self.on_trainers("device_uuid").get()[:1], *self.on_replicas("device_uuid").get()]
            if shared_gpus(devices):
                warnings.warn(f"model {self.name}: models[].generation.weight_sync collective over NCCL needs trainer "
                              f"rank 0 and each generation replica on a GPU of its own, but they share one (NCCL "
                              f"refuses two ranks on one device: 'Duplicate GPU detected'); its weights go through "
                              f"the object store instead", stacklevel=3)
                self.weight_sync = "object_store"
                return
        plan = self.on_trainers("sync_plan", self.sync_bucket_mb).get()
        host, port = ray.get(self.trainers[0].rendezvous.remote())
        world = 1 + len(self.generators)
        get_all([self.trainers[0].open_sync_group.remote(host, port, world, plan, self.sync_backend),
                 *(g.open_sync_group.remote(host, port, i + 1, world, plan, self.sync_backend)
                   for i, g in enumerate(self.generators))])
        self.sync_group_open = True

    def rng_states(self) -> list:
        """Each generation replica's torch RNG state (what sampling draws from)."""
        return self.on_replicas("get_rng_state").get()

    def set_rng_states(self, states: list) -> list[ray.ObjectRef]:
        return [g.set_rng_state.remote(s) for g, s in zip(self.generators, states, strict=True)]

    def join(self) -> None:
        """The trainer ranks form their process group (once; again after :meth:`restart_trainers`),
        once every rank has answered: a rank dead before the group forms is noticed while its
        peers wait in nothing, so that it alone is started again."""
        if not self.joined:
            self.on_trainers("node_id").get()
            self.forming = True
            join_process_group(self.trainers)
            self.joined, self.forming = True, False

    def lost_with(self, index: int) -> list[int]:
        """The replicas to start again when replica ``index`` dies: itself, and with the
        collective weight sync, once the replicas began a sync group, every other one (it may be
        stuck in a broadcast, or in the sync group's formation, with the dead one: a broadcast's
        root fails at once, its other receivers wait out the broadcast's time limit), as a trainer
        rank takes its peers."""
        return list(range(len(self.generators))) if self.weight_sync == "collective" and self.sync_group_begun \
            else [index]

    def restart_generator(self, index: int) -> object:
        """A new replica ``index`` on its bundle; the caller gives it weights and RNG state."""
        ray.kill(self.generators[index])  # a no-op when dead
        self.generators[index] = self.spawn_generator(index)
        self.sync_group_open = False  # the new replica joins a new group with the others
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
        self.joined = self.forming = self.sync_group_open = False
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
                                 device="cuda" if gen.num_gpus else "cpu", vllm=gen.vllm.resolved(gen.num_gpus))


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
    trainer_backend = trainer_class(tr.backend)
    trainer_cls = ray.remote(trainer_backend)
    # LoRA (workers.training.lora): the trainer ranks and the replicas inject the same adapters (one
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
