"""Where each model's weights come from: a local folder, or a tiny model built in code."""

from __future__ import annotations

from pathlib import Path

from orchestrator.config import ModelConfig
from orchestrator.tasks import Problem
from workers.model_zoo import build_zoo_model

ZOO_CACHE = Path(".cache/zoo")


def resolve_model_path(cfg: ModelConfig, train_set: list[Problem], cache_dir: Path = ZOO_CACHE) -> Path:
    """The model folder to load: ``path`` as given, or the zoo build of ``builder`` (cached).

    A built model's tokenizer corpus and warm-start data come from its own ``sft_tasks``
    mix (train-side prompts only), never from the eval sets.
    """
    if cfg.path is not None:
        return cfg.path
    assert cfg.builder is not None
    spec = cfg.builder.model_copy(update={"name": cfg.name})
    return build_zoo_model(spec, cache_dir=cache_dir)
