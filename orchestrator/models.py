"""Where each model's weights come from: a local folder, a GGUF file (or one shipped in a
Python package, converted once and cached), or a tiny model built in code."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.config import ModelConfig
from workers.model_zoo import MARKER, ModelSpec, build_zoo_model, zoo_folder
from workers.packaged import convert_gguf, needs_conversion

# $GRAFTPOOL_CACHE: the cache root, default .cache in the working directory. Set it to an
# absolute path where the working directory is a copy (a `ray job submit` job runs in an
# uploaded copy, without the git-ignored .cache) to reuse models already built.
ZOO_CACHE = Path(os.environ.get("GRAFTPOOL_CACHE") or ".cache") / "zoo"


def resolve_model_path(cfg: ModelConfig, cache_dir: Path = ZOO_CACHE) -> Path:
    """The model folder to load: ``path`` as given, or the zoo build of ``builder`` (cached).

    A built model's tokenizer corpus and warm-start data come from its own ``sft_tasks``
    mix (train-side prompts only), never from the eval sets.
    """
    if cfg.path is not None:
        # a GGUF file (or one inside a package) becomes a cached transformers folder
        return convert_gguf(cfg.path, cache_dir.parent) if needs_conversion(cfg.path) else cfg.path
    return build_zoo_model(_zoo_spec(cfg), cache_dir=cache_dir)


def _zoo_spec(cfg: ModelConfig) -> ModelSpec:
    assert cfg.builder is not None
    return cfg.builder.model_copy(update={"name": cfg.name})


def cached_model_path(cfg: ModelConfig, cache_dir: Path = ZOO_CACHE) -> Path | None:
    """The folder :func:`resolve_model_path` would return, when that needs no build: a plain
    ``path``, or a zoo model already complete in the cache. None for anything to build or
    convert (a GGUF conversion checks its own cache)."""
    if cfg.path is not None:
        return None if needs_conversion(cfg.path) else Path(cfg.path)
    folder = zoo_folder(_zoo_spec(cfg), cache_dir=cache_dir)
    return folder if (folder / MARKER).is_file() else None
