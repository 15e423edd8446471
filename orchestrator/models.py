"""Where each model's weights come from: a local folder, a Hugging Face hub id (resolved by each
actor in its node's cache, ``workers.hub``), a GGUF file (or one shipped in a Python package,
converted once and cached), or a tiny model built in code."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config import ConfigError, ModelConfig
from workers.hub import CHECK_FILES, model_folder
from workers.lora import check_targets
from workers.rollout.tokenizer import load_tokenizer
from workers.zoo.model_zoo import MARKER, ModelSpec, build_zoo_model, zoo_folder
from workers.zoo.packaged import convert_gguf, needs_conversion

# $GRAFTPOOL_CACHE: the cache root, default .cache in the working directory. Set it to an
# absolute path where the working directory is a copy (a `ray job submit` job runs in an
# uploaded copy, without the git-ignored .cache) to reuse models already built.
ZOO_CACHE = Path(os.environ.get("GRAFTPOOL_CACHE") or ".cache") / "zoo"


def resolve_model_path(cfg: ModelConfig, cache_dir: Path = ZOO_CACHE) -> Path:
    """What the actors load: ``path`` as given (a folder, or a hub id that each actor resolves in its
    own node's Hugging Face cache, ``workers.hub.model_folder``), a GGUF file's converted folder, or
    the zoo build of ``builder`` (cached).

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


def build_cost(cfg: ModelConfig) -> float:
    """A rough relative cost, to start the longest builds first (so that no long one starts
    last beside an idle core): warm-start tokens, sft_steps x sft_batch_size, twice for a
    character tokenizer (its sequences are about twice as long as BPE's); a GGUF conversion,
    a few seconds, counts 0. Measured on 2 cores: llama-char 79 s, qwen2-char 72 s,
    llama-char-vllm 58 s, gpt2-bpe 41 s."""
    if cfg.builder is None:
        return 0.0
    spec = cfg.builder
    return spec.sft_steps * spec.sft_batch_size * (2.0 if spec.tokenizer == "char" else 1.0)


def build_order(models: list[ModelConfig]) -> list[ModelConfig]:
    """The order builds start in: the costliest first (longest-processing-time first; ties keep
    the given order)."""
    return sorted(models, key=build_cost, reverse=True)


def build_models(models: list[ModelConfig], jobs: int = 1, report=print) -> None:
    """Build (zoo) or convert (GGUF) ``models`` into the cache, ``jobs`` at a time (each in a
    process of its own, on one core), so that runs that use them start at once; models listed
    twice (same name, path and builder) are built once, the costliest first (:func:`build_cost`).
    Reports each as ``name: folder`` when it is done; cached models need no process."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    unique: dict[str, ModelConfig] = {}
    for model in models:
        unique.setdefault(model.model_dump_json(include={"name", "path", "builder"}), model)
    todo = []
    for model in unique.values():
        folder = cached_model_path(model)
        if folder is None:
            todo.append(model)
        else:
            report(f"{model.name}: {folder}")
    if todo:
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(todo))), mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(resolve_model_path, model): model for model in build_order(todo)}
            for future in as_completed(futures):  # reported as each one is done
                report(f"{futures[future].name}: {future.result()}")


def model_tokenizer(m: ModelConfig, path: Path | str):
    """The model's tokenizer from its resolved folder (a hub id: its config and tokenizer files in
    this machine's Hugging Face cache, downloaded unless ``HF_HUB_OFFLINE``), as its actors load
    it; a :class:`ConfigError` naming the model where it does not load."""
    try:
        return load_tokenizer(model_folder(path, CHECK_FILES), m.trust_remote_code, m.pad_token)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"models.{m.name}: {exc}") from None


def check_models(models: Sequence[ModelConfig], paths: Mapping[str, Path]) -> dict[str, object]:
    """Each model's tokenizer loads from its resolved folder (``paths``; a hub id: its config and
    tokenizer files in this machine's Hugging Face cache, downloaded unless ``HF_HUB_OFFLINE``) and
    its LoRA target modules exist in it (a meta-device build, no weights): otherwise a
    :class:`ConfigError` naming the model, before any actor starts. Returns the tokenizers by
    model name, for the start-up's other checks (``prompt_lengths``)."""
    tokenizers = {}
    for m in models:
        tokenizers[m.name] = model_tokenizer(m, paths[m.name])
        if m.lora is not None:
            try:
                check_targets(model_folder(paths[m.name], CHECK_FILES), m.lora.model_dump(), m.trust_remote_code)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"models.{m.name}.{exc}") from None
    return tokenizers
