"""A model folder that the driver built or converted, on nodes that may not see the driver's disk.

The driver resolves each model to a folder (a zoo build or a GGUF conversion in its cache, or a
folder the user named) or to a hub id (``workers.hub``: every node resolves that in its own
Hugging Face cache, unchanged here). A folder goes to the actors as a :class:`ModelSource`: its
absolute path on the driver, a :func:`fingerprint` of its files and, where a node of the model's
actors does not see that folder (no shared disk), its files in Ray's object store, one
``{relative path: [chunk refs]}`` object per model, each file in chunks of at most 64 MiB
(``workers.file_chunks``, ``orchestrator.cluster.model_shipping``).

An actor loads :func:`local_model`: the driver's folder itself where it sees it with the same
fingerprint (one machine, or a disk every node mounts at the same path: nothing copied), else the
shipped files, written once per node into :func:`node_cache` (``$GRAFTPOOL_CACHE/shipped``, else
``<temp dir>/graftpool-models``) under a lock, as ``<folder name>-<content[:16]>`` (``content``: the
sha256 of the shipped files' paths and bytes, computed by the driver as it reads them to ship), and
reused by later actors and runs on that node: only a copy of the same bytes.

``fingerprint(folder) = sha256(for each file, sorted: relative path, size; then config.json's
bytes)``: a stat of every file, so cheap even for GB of weights; what a node's own folder at the
driver's path is checked against. It does not tell apart two folders of the same name whose
weights differ at the same sizes (a run's ``final/<model>`` after a resumed run re-exported it),
so it does not name a node's shipped copy.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graftpool.cache_lock import build_once
from workers.file_chunks import get_files

SHIPPED_MARKER = ".graftpool-shipped"
"""Written last into a node's copy of shipped files: the copy is complete."""


@dataclass(frozen=True)
class ModelSource:
    """What an actor is told of a model folder the driver resolved."""

    path: str  # the folder, absolute, as the driver sees it
    fingerprint: str  # fingerprint(path) on the driver
    files: list[Any] | None = None  # [ObjectRef of {relative path: [chunk refs]}] when some node does not see path
    content: str = ""  # with files: sha256 of their relative paths and bytes (the name of a node's copy)

    def __str__(self) -> str:  # error messages name the driver's folder
        return self.path


def fingerprint(folder: str | Path) -> str:
    """sha256 over every file's relative path and size (sorted) and ``config.json``'s bytes."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{path.stat().st_size}\n".encode())
    config = folder / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    return digest.hexdigest()


def sees(path: str | Path, expected: str) -> bool:
    """Whether this process sees the folder ``path`` with fingerprint ``expected``."""
    return Path(path).is_dir() and fingerprint(path) == expected


def node_cache() -> Path:
    """Where this node keeps shipped model folders: ``$GRAFTPOOL_CACHE/shipped`` (as this
    process resolves it), else ``<temp dir>/graftpool-models``."""
    root = os.environ.get("GRAFTPOOL_CACHE")
    return (Path(root).resolve() / "shipped") if root else Path(tempfile.gettempdir()) / "graftpool-models"


def local_model(source: str | Path | ModelSource) -> str | Path:
    """The folder (or hub id) this actor loads: a plain path or hub id as it is; a
    :class:`ModelSource`'s own folder where this node sees it, else its shipped files written
    into :func:`node_cache`. Raises ``FileNotFoundError`` naming the folder where neither works."""
    if not isinstance(source, ModelSource):
        return source
    if sees(source.path, source.fingerprint):
        return source.path
    if source.files is None:
        raise FileNotFoundError(
            f"models[].path: this node does not see the model folder {source.path} that the driver resolved (or "
            "sees other files there), and the driver did not ship it: the node joined after the model's actors "
            "were placed; start the run again, or put the model on a disk every node mounts at that path")
    import ray

    # named by the shipped bytes: two folders of one name and the same file sizes (a run's final/<model>
    # re-exported by a resumed run, or another run's) are two copies, not the first one reused
    folder = node_cache() / f"{Path(source.path).name}-{(source.content or source.fingerprint)[:16]}"

    def write() -> Path:
        partial = folder.with_name(folder.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)  # what a writer that died left
        get_files(ray.get(source.files[0]), partial)  # one chunk in memory at a time
        (partial / SHIPPED_MARKER).write_text(source.fingerprint)
        partial.rename(folder)
        return folder

    return str(build_once(folder, SHIPPED_MARKER, write))
