"""A new MLflow SQLite store, made as a copy of an empty one.

MLflow makes a SQLite store's tables by running all of its schema migrations (alembic) on
first use: about 2-3 CPU s on a 2-core machine, in every process that opens a store file
that is not there yet. A run folder with its own ``mlflow.db`` (``run.output_dir`` per run,
as the tests and benchmarks use) paid that at every start. Here MLflow itself makes one
empty store per MLflow version, once, under the cache root (``$GRAFTPOOL_CACHE``, default
``.cache``); a new store is a copy of it (0.04 s), with the same schema and the same
``Default`` experiment as one MLflow would have made in its place.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from urllib.parse import urlparse

import mlflow
from mlflow.tracking import MlflowClient

from graftpool.cache_lock import cache_lock


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///path`` tracking URI; None for any other URI (or in-memory)."""
    parsed = urlparse(uri)
    if parsed.scheme != "sqlite" or parsed.netloc or parsed.path in ("", "/", "/:memory:"):
        return None
    return Path(parsed.path)


def template_path(cache_root: Path | None = None) -> Path:
    root = Path(cache_root or os.environ.get("GRAFTPOOL_CACHE") or ".cache")
    return root / "mlflow" / f"empty-{mlflow.__version__}.db"


def _make_template(template: Path) -> None:
    """MLflow's own empty store, written beside ``template`` and renamed into place."""
    fresh = template.with_name(f".{template.name}.{os.getpid()}.tmp")
    fresh.unlink(missing_ok=True)
    MlflowClient(tracking_uri=f"sqlite:///{fresh.resolve()}").search_experiments()  # runs the migrations
    os.replace(fresh, template)


def seed_sqlite_store(uri: str, cache_root: Path | None = None) -> bool:
    """Copy the empty store to ``uri``'s file if the URI is a SQLite file that is not there
    yet; True when it did. Other URIs and existing files are left alone. The copy is renamed
    into place, so a process opening the store never sees half a file, and a store another
    process made first is kept."""
    target = sqlite_file(uri)
    if target is None or target.exists():
        return False
    template = template_path(cache_root)
    if not template.exists():
        with cache_lock(template):  # one process makes it; the others wait, then copy
            if not template.exists():
                _make_template(template)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    shutil.copyfile(template, partial)
    try:
        os.link(partial, target)  # fails if another process made the store meanwhile: keep theirs
    except FileExistsError:
        return False
    finally:
        partial.unlink()
    return True
