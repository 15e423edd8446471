"""One builder at a time per cache folder, across processes.

``make test`` builds the main and the scale environment's models side by side, and both
configs name the same gpt2 model: without a lock, two processes trained the same model at
once and one threw its copy away (about 40 CPU s on a 2-core machine). With it, the second
waits for the first, then finds the folder complete and loads it.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def cache_lock(folder: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``.<folder name>.lock`` beside ``folder`` (created if
    missing, left in place: removing it would race with a waiting process). The lock goes
    with the process, so a builder that crashes never leaves others waiting."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_once(folder: Path, marker: str, build: Callable[[], Path]) -> Path:
    """``folder`` when its ``marker`` file says it is complete, else ``build()`` under
    :func:`cache_lock`; the marker is looked at again once the lock is held, since another
    process may have finished the folder while this one waited."""
    if (folder / marker).is_file():
        return folder
    with cache_lock(folder):
        if (folder / marker).is_file():
            return folder
        return build()
