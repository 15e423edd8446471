"""Files through Ray's object store a chunk at a time, where a node does not share the driver's disk.

A folder's files go into the object store in chunks of at most :data:`CHUNK_BYTES`
(:func:`put_files`) and come out written under another folder (:func:`get_files`): a process that
sends or receives them holds one chunk at a time, never a whole file (a 3 B model's ZeRO-3
optimizer partition is 18 GB a rank, more than the head's memory in ``cluster.yaml``, 32 GiB,
for a model's two ranks). The trainer ranks' checkpoint and final-model files
(``workers.training.node_files``) and the model folders the driver ships (``workers.model_files``)
travel so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CHUNK_BYTES = 64 * 2**20
"""The most bytes of a file in one object-store object (:func:`put_files`)."""

FileRefs = dict[str, list]
"""Files in the object store: relative path (POSIX separators) -> the object refs of its chunks, in order."""


def read_tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path relative to ``folder`` (POSIX separators)."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def put_files(folder: Path, chunk_bytes: int = CHUNK_BYTES, digest: Any = None) -> FileRefs:
    """Every file under ``folder`` put into the object store by this process, in chunks of at
    most ``chunk_bytes`` read one at a time (an empty file: no chunk); ``digest`` (a ``hashlib``
    object), if given, is fed every file's relative path, size and bytes as they are read."""
    import ray

    folder = Path(folder)
    out: FileRefs = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            rel = path.relative_to(folder).as_posix()
            if digest is not None:
                digest.update(f"{rel}\0{path.stat().st_size}\n".encode())  # where each file's bytes begin
            out[rel] = []
            with path.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(chunk_bytes), b""):
                    if digest is not None:
                        digest.update(chunk)
                    out[rel].append(ray.put(chunk))
    return out


def get_files(files: FileRefs, folder: Path) -> None:
    """The files of :func:`put_files` written under ``folder``, one chunk in memory at a time."""
    import ray

    for rel, chunks in files.items():
        path = Path(folder) / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            for ref in chunks:
                f.write(ray.get(ref))
