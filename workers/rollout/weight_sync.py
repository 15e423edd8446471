"""Collective weight sync (``models[].generation.weight_sync: collective``): trainer rank 0
broadcasts its weights to the model's generation replicas over a process group of their own,
in buckets, instead of one full state dict per replica through Ray's object store.

The group is standalone (a ``TCPStore`` at rank 0's node and a ``ProcessGroupGloo`` on CPU or
``ProcessGroupNCCL`` on GPU built on it), so it lives beside the trainer's data-parallel
default group, as verl's and OpenRLHF's weight-update groups do. Rank 0 is the trainer; the
replicas are ranks 1..R. What is sent is fixed by a :class:`SyncPlan` (names, shapes and
dtypes, cut into buckets of at most ``bucket_mb`` of one dtype each), made once by the trainer
and handed to the replicas through Ray (it is small); every sync then moves each bucket with
one ``broadcast`` of a flat tensor: the same bytes reach every replica, and the object store
carries nothing.

Two time limits: forming the group waits at most :data:`RENDEZVOUS_S` for every member (a
member that died before joining must not hold the others, the trainer among them, for long),
each broadcast at most :data:`BROADCAST_S` (a bucket of a large model over TCP).
"""

from __future__ import annotations

import datetime
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workers.dispatch import Dispatch, dispatch

RENDEZVOUS_S = 60.0  # forming a sync group: every member joins within this
BROADCAST_S = 600.0  # one bucket's broadcast


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # e.g. "float32": torch.dtype does not travel through Ray's pickling as cleanly

    @property
    def numel(self) -> int:
        out = 1
        for size in self.shape:
            out *= size
        return out


@dataclass(frozen=True)
class SyncPlan:
    """What each sync broadcasts, in order: buckets of tensors of one dtype each."""

    buckets: tuple[tuple[TensorSpec, ...], ...]

    @property
    def nbytes(self) -> int:
        return sum(spec.numel * torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
                   for bucket in self.buckets for spec in bucket)


def make_plan(state: dict[str, torch.Tensor], bucket_mb: float = 256.0) -> SyncPlan:
    """Cut the state dict, in its order, into buckets of at most ``bucket_mb`` MiB of one dtype
    (a tensor larger than a bucket gets a bucket of its own)."""
    limit = int(bucket_mb * 2**20)
    buckets: list[list[TensorSpec]] = []
    size = 0
    for name, tensor in state.items():
        spec = TensorSpec(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."))
        nbytes = tensor.numel() * tensor.element_size()
        if not buckets or buckets[-1][0].dtype != spec.dtype or size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(spec)
        size += nbytes
    return SyncPlan(tuple(tuple(bucket) for bucket in buckets))


def rendezvous_address() -> tuple[str, int]:
    """Where a process group can meet at this process: (this node's IP, a TCP port free on it).
    The IP is Ray's node IP inside a Ray worker (127.0.0.1 on a single-machine instance,
    ``orchestrator.cluster.local_ray``), else loopback."""
    host = "127.0.0.1"
    try:
        import ray

        if ray.is_initialized():
            host = ray.util.get_node_ip_address()
    except ImportError:
        pass
    with socket.socket() as s:
        s.bind((host, 0))
        return host, s.getsockname()[1]


def open_group(host: str, port: int, rank: int, world_size: int, backend: str = "gloo",
               timeout_s: float = RENDEZVOUS_S):
    """Join the sync group at ``host:port`` (rank 0 hosts the store): every member must call
    this at about the same time, and all have joined within ``timeout_s`` or each raises (the
    group's default timeout; broadcasts set their own, :func:`send`). Returns the process group
    (a c10d backend object)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(host, port, world_size, rank == 0, timeout=timeout)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    if backend == "nccl":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("weight_sync: collective over NCCL needs a CUDA build of torch")
        return nccl(store, rank, world_size)
    raise ValueError(f"weight sync backend: expected gloo or nccl, got {backend!r}")


def _broadcast(group, flat: torch.Tensor, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    group.broadcast([flat], opts).wait()


def send(group, state: dict[str, torch.Tensor], plan: SyncPlan, device: str | torch.device = "cpu",
         timeout_s: float = BROADCAST_S) -> int:
    """Rank 0: broadcast ``state`` bucket by bucket from ``device`` (the group's: cuda for
    NCCL); returns the bytes sent (to each replica)."""
    sent = 0
    for bucket in plan.buckets:
        flat = torch.cat([state[spec.name].detach().reshape(-1).to(device) for spec in bucket])
        _broadcast(group, flat, timeout_s)
        sent += flat.numel() * flat.element_size()
    return sent


def receive(group, plan: SyncPlan, device: str | torch.device = "cpu", timeout_s: float = BROADCAST_S):
    """Ranks 1..R: yield (name, tensor) for every tensor of the plan, bucket by bucket (one
    bucket's buffer in memory at a time)."""
    for bucket in plan.buckets:
        dtype = getattr(torch, bucket[0].dtype)
        flat = torch.empty(sum(spec.numel for spec in bucket), dtype=dtype, device=device)
        _broadcast(group, flat, timeout_s)
        offset = 0
        for spec in bucket:
            yield spec.name, flat[offset:offset + spec.numel].view(spec.shape)
            offset += spec.numel


def cuda_device_uuid(device=None) -> str:
    """The UUID of the CUDA device this process computes on (``device``, else the current one),
    "" without CUDA."""
    if not torch.cuda.is_available() or (device is not None and torch.device(device).type != "cuda"):
        return ""
    index = torch.device(device).index if device is not None and torch.device(device).index is not None \
        else torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(index).uuid)


class SyncSource:
    """The trainer's side of the process groups it opens with others (a mixin of
    ``workers.training.trainer.TorchTrainer``): where rank 0 can be met, and rank 0 as the source of
    the collective weight sync. Uses the trainer's ``rank``, ``model``, ``device``,
    ``dist_backend`` and ``weights_for_sync``."""

    @dispatch(Dispatch.RANK0)
    def rendezvous(self) -> tuple[str, int]:
        """Where the model's process group meets (asked of rank 0): this node's IP as Ray
        knows it and a port free on this node, so that ranks on other nodes can connect."""
        return rendezvous_address()

    @dispatch(Dispatch.EACH_RANK)
    def device_uuid(self) -> str:
        """The UUID of this rank's CUDA device ("" on a CPU): a sync group over NCCL needs its
        members on different GPUs."""
        return cuda_device_uuid(getattr(self, "device", None))

    @dispatch(Dispatch.EACH_RANK)
    def node_id(self) -> str:
        """The Ray node this rank runs on (the run folder's ``actors.json``)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    # -- collective weight sync: rank 0 is the group's source ------------------------------

    def _sync_source(self) -> dict[str, torch.Tensor] | None:
        """Rank 0: the weights as they are, on their device (no copy); others None. A sharded
        backend gathers here instead (every rank takes part)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()} if self.rank == 0 else None

    @dispatch(Dispatch.ALL_RANKS)
    def sync_plan(self, bucket_mb: float = 256.0) -> SyncPlan | None:
        """Called on every rank (a sharded backend gathers); rank 0's plan of what each sync sends."""
        weights = self._sync_source()
        return None if weights is None else make_plan(weights, bucket_mb)

    @dispatch(Dispatch.RANK0)
    def open_sync_group(self, host: str, port: int, world_size: int, plan: SyncPlan, backend: str = "gloo") -> bool:
        """Rank 0 only: host the sync group (rank 0 of ``world_size``: itself and the replicas),
        over ``backend`` (nccl when this rank and the replicas are on GPUs, else gloo)."""
        device = self.device if backend == "nccl" else torch.device("cpu")
        self._sync = (open_group(host, port, 0, world_size, backend), plan, device)
        return True

    @dispatch(Dispatch.ALL_RANKS)
    def broadcast_weights(self) -> int:
        """Called on every rank (a sharded backend gathers); rank 0 broadcasts the weights to
        the replicas in the sync group. Returns the bytes rank 0 sent to each replica."""
        weights = self._sync_source()
        if weights is None:
            return 0
        group, plan, device = self._sync
        return send(group, weights, plan, device)

