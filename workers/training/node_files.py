"""A trainer rank's checkpoint and final-model files when its node does not share the driver's disk.

A trainer rank writes its checkpoint shard (``save``) and rank 0 the final model (``export``)
into a folder of its own node. Where that folder is the driver's too (one machine, or a run
folder on a disk every node mounts) the driver finds them there. Where it is not, the files
travel through Ray's object store in chunks of at most ``CHUNK_BYTES``
(``workers.file_chunks``: ``put_files``, ``get_files``): :meth:`NodeFiles.save_files` and
:meth:`NodeFiles.export_files` write into a private temporary folder and return what was
written, ``{relative path: [object refs of its chunks]}``; :meth:`NodeFiles.load_files` writes
what the driver sends into one and loads from it. A process that sends or receives the files
holds one chunk of them at a time, never a whole file: a 3 B model's ZeRO-3 optimizer partition
is 18 GB a rank, more than the head's memory in ``cluster.yaml`` (32 GiB) for a model's two
ranks. The backend's own ``save``/``load``/``export`` are used unchanged, so the files are byte
for byte the ones a shared disk would hold.

:meth:`NodeFiles.probe` is what the driver asks at start-up to learn which folders a rank
sees (``orchestrator.controller.node_layout``).
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path

import pyarrow.fs as pafs
import ray

from workers.dispatch import Dispatch, dispatch
from workers.file_chunks import CHUNK_BYTES, FileRefs, get_files, put_files, read_tree

PROBE_FILE = ".graftpool-probe"
"""The file the driver writes into the run folder (and ``run.storage``) at start-up, holding a token."""


def storage_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``run.storage``'s filesystem and base path: a URI (``s3://``, ``file:///``) as pyarrow
    reads it, a plain path resolved against this process's working directory."""
    if "://" not in uri:
        uri = str(Path(uri).resolve())
    return pafs.FileSystem.from_uri(uri)


def node_ip() -> str:
    """This node's IP as Ray knows it (its host name outside Ray)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - not in a Ray worker
        return socket.gethostname()


def sees_probe(fs: pafs.FileSystem, path: str, token: str) -> bool:
    """Whether ``path`` on ``fs`` is a file holding ``token``."""
    try:
        with fs.open_input_stream(path) as f:
            return f.read().decode() == token
    except (OSError, FileNotFoundError):
        return False


class NodeFiles:
    """The trainer's side of moving its files between nodes (mixed into ``TorchTrainer``; the
    class provides ``rank``, ``save``, ``load`` and ``export``)."""

    rank: int

    @dispatch(Dispatch.EACH_RANK)
    def probe(self, run_dir: str, token: str, storage: str | None = None, run_name: str = "") -> dict:
        """What this rank sees of the driver's probe files: ``run_dir`` (as the driver names it,
        resolved on this node) and ``<storage>/<run_name>``. Returns the node's IP, the paths as
        this node resolves them and whether each holds ``token``."""
        folder = Path(run_dir).resolve()
        seen = {"node": node_ip(), "run_dir": str(folder),
                "sees_run_dir": sees_probe(pafs.LocalFileSystem(), str(folder / PROBE_FILE), token)}
        if storage:
            try:
                fs, base = storage_filesystem(storage)
                path = f"{base.rstrip('/')}/{run_name}/{PROBE_FILE}"
                seen.update(storage=path, sees_storage=sees_probe(fs, path, token))
            except (OSError, ValueError) as exc:  # no such filesystem here, no credentials, ...
                seen.update(storage=f"{storage} ({exc})", sees_storage=False)
        return seen

    @dispatch(Dispatch.EACH_RANK)
    def save_files(self, chunk_bytes: int = CHUNK_BYTES) -> FileRefs:
        """``save`` into a private temporary folder on this node; its files in the object store
        (``put_files``), by relative path."""
        with tempfile.TemporaryDirectory(prefix="graftpool-save-") as tmp:
            self.save(tmp)  # type: ignore[attr-defined]
            return put_files(Path(tmp), chunk_bytes)

    @dispatch(Dispatch.EACH_RANK)
    @ray.method(num_returns=2)
    def snapshot_files(self) -> tuple[dict[str, bytes], bool]:
        """``save`` into a private temporary folder; two results: its files as bytes, and ``True``
        once they are saved, which the driver waits on (its death raised there) without fetching
        the files (``orchestrator.controller.snapshot``). The files are the task's return value,
        owned by the driver and kept in this node's object store, so they outlive this rank; the
        chunks :meth:`save_files` puts are owned by the rank and die with it."""
        with tempfile.TemporaryDirectory(prefix="graftpool-snapshot-") as tmp:
            self.save(tmp)  # type: ignore[attr-defined]
            return read_tree(Path(tmp)), True

    @dispatch(Dispatch.ALL_RANKS)
    def load_snapshot(self, ranks_files: list) -> int:
        """``load`` from a private temporary folder holding a step snapshot's files: ``ranks_files``,
        the object refs of every rank's :meth:`snapshot_files` (in a list, so Ray passes them
        unopened), fetched and written one rank's at a time. The driver never holds them: a 3 B
        model's ZeRO-3 snapshot is 18.5 GB a rank (12 bytes a parameter over two ranks), more than
        the head's memory in ``cluster.yaml`` (32 GiB) for a model's two ranks; a rank holds one
        rank's files at a time, on a GPU node's host memory (``g6e.12xlarge``: 384 GiB)."""
        with tempfile.TemporaryDirectory(prefix="graftpool-load-") as tmp:
            for ref in ranks_files:
                files = ray.get(ref)
                for rel, data in files.items():
                    path = Path(tmp) / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(data)
                del files
            return self.load(tmp)  # type: ignore[attr-defined]

    @dispatch(Dispatch.ALL_RANKS)
    def load_files(self, files: FileRefs) -> int:
        """``load`` from a private temporary folder holding ``files`` (the model's checkpoint
        folder as the driver put it, ``put_files``); the policy version."""
        with tempfile.TemporaryDirectory(prefix="graftpool-load-") as tmp:
            get_files(files, Path(tmp))
            return self.load(tmp)  # type: ignore[attr-defined]

    @dispatch(Dispatch.ALL_RANKS)
    def export_files(self, chunk_bytes: int = CHUNK_BYTES) -> FileRefs:
        """``export`` (every rank: a sharded backend gathers) into a private temporary folder;
        rank 0's files (the transformers folder) in the object store, the other ranks' ``{}``."""
        with tempfile.TemporaryDirectory(prefix="graftpool-export-") as tmp:
            self.export(Path(tmp) / "model")  # type: ignore[attr-defined]
            return put_files(Path(tmp) / "model", chunk_bytes) if self.rank == 0 else {}
