"""Where the trainer ranks' files go when the run's nodes may share no disk.

A trainer rank writes its checkpoint shard and rank 0 the final model on its own node; the
driver writes the rest of a checkpoint (``orchestrator.controller.checkpoint``), renames it into
place and uploads it to ``run.storage``, all on the head. :func:`check_layout`, at start-up and
again whenever a model's ranks are started again (perhaps on other nodes), finds out for each
model which of two ways works:

* **shared**: every rank sees the run folder the driver writes (one machine, or a run folder on
  a disk every node mounts at the same path): the ranks write into it, as the driver names it
  (``trainer.save``/``load``/``export`` on ``<run folder>/...``);
* **through the driver**: otherwise. Each rank writes into a private temporary folder on its
  node and returns the files as bytes through Ray's object store; the driver writes them into
  the run folder on the head, byte for byte what a shared disk would hold, and a load sends the
  model's checkpoint files back (``workers.training.node_files.NodeFiles``). No shared disk is
  needed; the files pass through the driver's memory one chunk at a time
  (``workers.file_chunks.CHUNK_BYTES``), never a whole file.

The test is a probe: the driver writes a random token into ``<run folder>/.graftpool-probe``
and every rank reports whether it reads that token at the path the driver names
(``NodeFiles.probe``). With ``run.storage`` the token also goes to ``<storage>/<run.name>`` (the
driver, on the head, is the only process that reads or writes storage: the write checks that it
can). Where storage is a path or ``file://`` URI (:func:`on_local_disks`), a rank that does not
read it there stops the run before step 0, naming its node, the path and ``run.storage``: storage
is the run's durable copy, which a job resubmitted with ``--resume`` (its driver on whichever
node then heads the cluster) restores from, and a path on one node's own disk would leave it on
that node alone. An object store (``s3://``, ``gs://``) is not probed from the ranks: no rank
uses it, and on ``cluster.yaml`` the GPU workers hold no credentials for it (Ray's launcher gives
its instance profile, with S3 access, to the head only), so the probe failed every such run.
"""

from __future__ import annotations

import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.fs as pafs
import ray
from ray.exceptions import ObjectLostError

from orchestrator.cluster.actor_calls import get_all, raise_if_dead
from orchestrator.config import ConfigError
from workers.file_chunks import FileRefs, get_files, put_files
from workers.training.node_files import PROBE_FILE
from workers.training.trainer import TorchTrainer

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext

STAGING = ".tmp-"
"""The prefix of a final model's folder while it is written (:func:`export_trainers`)."""


def check_layout(ctrl: RunContext, names: list[str] | None = None) -> dict[str, bool]:
    """Probe what the trainer ranks of ``names`` (default: every model's) see and record in
    ``ctrl.shared`` whether each model's ranks share the driver's run folder; returns that. Raises
    :class:`ConfigError` naming the rank's node and path when a rank does not reach ``run.storage``."""
    token = secrets.token_hex(16)
    probe = ctrl.run_dir / PROBE_FILE
    probe.write_text(token)
    storage = ctrl.storage
    if storage is not None:
        with storage.fs.open_output_stream(storage._path(PROBE_FILE)) as f:
            f.write(token.encode())
    probed = ctrl.config.run.storage if storage is not None and on_local_disks(storage.fs) else None
    try:
        seen = {name: ctrl.actors[name].on_trainers(TorchTrainer.probe, str(ctrl.run_dir), token, probed,
                                                    ctrl.run_dir.name) for name in (names or ctrl.names)}
        seen = {name: pending.get() for name, pending in seen.items()}
    finally:
        probe.unlink(missing_ok=True)
        if storage is not None:
            storage.delete(PROBE_FILE)
    for name, ranks in seen.items():
        for rank, rank_seen in enumerate(ranks):
            if probed is not None and not rank_seen["sees_storage"]:
                raise ConfigError(
                    f"run.storage: trainer rank {rank} of model {name} on node {rank_seen['node']} does not see "
                    f"{rank_seen['storage']}, where the driver wrote {storage._path(PROBE_FILE)} "
                    f"({storage.uri}): a path for run.storage must be mounted at the same place on every node; set it "
                    "so, or to an object store URI (s3://bucket/prefix, gs://...), which the driver alone uses")
        was, ctrl.shared[name] = ctrl.shared.get(name), all(r["sees_run_dir"] for r in ranks)
        if was is not False and not ctrl.shared[name]:  # said once, and again if it changes
            apart = sorted({f"{r['node']} ({r['run_dir']})" for r in ranks if not r["sees_run_dir"]})
            print(f"model {name}: trainer ranks on {', '.join(apart)} do not see the run folder "
                  f"{ctrl.run_dir.resolve()} as the driver does (no shared disk): their checkpoint and "
                  "final-model files pass through the driver", flush=True)
    return dict(ctrl.shared)


def on_local_disks(fs: pafs.FileSystem) -> bool:
    """Whether ``run.storage``'s filesystem is a disk path (a plain path, ``file://``, an NFS
    mount), which one node may hold alone, rather than an object store every node reaches alike."""
    return isinstance(fs, pafs.LocalFileSystem)


def save_trainers(ctrl: RunContext, folder: Path) -> None:
    """Every model's ranks save their checkpoint files into ``folder/<model>`` (the driver's
    path): written there by the ranks where they share it, else returned and written here."""
    calls = {name: ctrl.actors[name].on_trainers(TorchTrainer.save, str(folder / name)) if ctrl.shared[name]
             else ctrl.actors[name].on_trainers(TorchTrainer.save_files)
             for name in ctrl.names}
    for name, pending in calls.items():
        files = get_all(pending.refs)  # the refs of each rank's chunks (the bytes stay in the object store)
        (folder / name).mkdir(parents=True, exist_ok=True)
        if not ctrl.shared[name]:
            for rank, rank_files in zip(ctrl.actors[name].trainers, files, strict=True):
                fetch_rank_files(rank, rank_files, folder / name)  # one chunk in memory at a time
        del files


def load_trainers(ctrl: RunContext, name: str, folder: Path) -> int:
    """Model ``name``'s ranks load checkpoint folder ``folder/<name>``; the policy version."""
    actors = ctrl.actors[name]
    if ctrl.shared[name]:
        return actors.on_trainers(TorchTrainer.load, str(folder / name)).get()
    return actors.on_trainers(TorchTrainer.load_files, put_files(folder / name)).get()


def export_trainers(ctrl: RunContext, final: Path) -> None:
    """Every model's final weights and tokenizer as a transformers folder ``final/<model>``, written
    into ``final/.tmp-<model>`` and put in place once every model's is whole (:func:`put_in_place`).
    Written in place, an export stopped part way (``ray job stop``, a lost head) over an earlier one
    (a finished run resumed for more ``run.steps``) left some of its files beside the earlier
    export's: a model of two runs' shards that ``eval`` and ``serve`` loaded without a word."""
    staging = {name: final / f"{STAGING}{name}" for name in ctrl.names}
    for folder in staging.values():
        shutil.rmtree(folder, ignore_errors=True)  # a stopped export's
    calls = {name: ctrl.actors[name].on_trainers(TorchTrainer.export, str(staging[name])) if ctrl.shared[name]
             else ctrl.actors[name].on_trainers(TorchTrainer.export_files)
             for name in ctrl.names}
    for name, pending in calls.items():
        files = get_all(pending.refs)
        if not ctrl.shared[name]:
            fetch_rank_files(ctrl.actors[name].trainers[0], files[0], staging[name])  # rank 0's
        del files
    for name in ctrl.names:
        put_in_place(staging[name], final / name)


def put_in_place(staging: Path, folder: Path) -> None:
    """``staging`` renamed to ``folder``, an earlier ``folder`` moved aside first and deleted after:
    a stop in between leaves no ``folder`` (``eval`` and ``serve`` say so), never a mixed one."""
    aside = folder.with_name(f".old-{folder.name}")
    shutil.rmtree(aside, ignore_errors=True)
    if folder.exists():
        folder.rename(aside)
    staging.rename(folder)
    shutil.rmtree(aside, ignore_errors=True)


def fetch_rank_files(rank: ray.actor.ActorHandle, files: FileRefs, folder: Path) -> None:
    """``get_files`` of the chunks ``rank`` put (``NodeFiles.save_files`` / ``export_files``), which
    it owns: a rank that dies after it answered and before the driver has fetched them all (a lost
    GPU node, while a 3 B model's 37 GB of checkpoint files cross to the head) takes them with it, and
    the fetch fails with Ray's ``OwnerDiedError``, no actor's death to ``faults.with_retries``, so the
    job stopped instead of recovering the trainer. There the rank's death is raised (Ray's
    ``RayActorError`` naming it: the trainer is recovered as any other rank's death); a rank
    still alive, the loss itself."""
    try:
        get_files(files, folder)
    except ObjectLostError:
        raise_if_dead(rank)  # a dead rank raises its death here
        raise
