"""Where each model's weights come from: a local folder, a GGUF file (or one shipped in a
Python package, converted once and cached), or a tiny model built in code."""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.config import ModelConfig
from workers.model_zoo import build_zoo_model
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
    assert cfg.builder is not None
    spec = cfg.builder.model_copy(update={"name": cfg.name})
    return build_zoo_model(spec, cache_dir=cache_dir)


def prebuild(config_paths: list[str], processes: int = 2) -> list[Path]:
    """Build (or find cached) every zoo model of the given configs, ``processes`` at a time.

    A warm start runs on one thread, so on a 2-core machine two builds side by side take the
    time of one; ``make test`` calls this before the suite so that the tests find the cache
    warm (each test still resolves its models through :func:`resolve_model_path`)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from orchestrator.config import load_config

    specs = {}
    for path in config_paths:
        for model in load_config(path).models:
            if model.builder is not None:
                spec = model.builder.model_copy(update={"name": model.name})
                specs[spec.model_dump_json()] = spec
    with ProcessPoolExecutor(max_workers=processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_build, specs.values()))


def _build(spec) -> Path:
    return build_zoo_model(spec, cache_dir=ZOO_CACHE)


if __name__ == "__main__":
    import sys

    for folder in prebuild(sys.argv[1:]):
        print(f"zoo model ready: {folder}")
