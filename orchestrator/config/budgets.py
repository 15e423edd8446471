"""A real model left on the CPU defaults, or a GPU trainer that would form whole-vocabulary
logits without a token budget: said at load.

A model given by ``path`` with no ``generation.num_gpus`` and the default budgets runs a real
LM on CPU with a few new tokens per response: the README's own-models snippet did that without
a word. :func:`toy_budget_warnings` names such models; ``load_config`` warns with each line.

A model is *real* when its estimated parameter count is at least :data:`REAL_PARAMETERS`. The
estimate reads no weights (loading a config must stay cheap, without torch):

- a folder with a transformers ``config.json``: ``12 L h^2 + V h`` (L layers of width h, each
  4 h^2 of attention and 8 h^2 of MLP; V h for the embeddings);
- a ``.gguf`` file: its size in bytes (one byte a parameter, 8-bit quantisation; a 4-bit file
  is under-counted by half, still far past the threshold for a 100 M model);
- other folders: the bytes of their weight files / 2 (bf16).

:func:`full_logits_warnings` names GPU trainers that take the full-logits path (DeepSpeed ZeRO-3,
whose engine forward runs the whole causal LM, or ``trainer.logprob_chunk_tokens: null``) with no
``trainer.max_tokens_per_micro_batch``: their scoring forwards then hold
``rows x (prompt + response) x V`` logits, rows = min(256, prompt_batch x n) (``SCORE_ROWS``).

:func:`update_budget_warnings` names the other GPU trainers of a real model with no
``trainer.max_tokens_per_micro_batch``: each update's forward then takes a rank's whole share of a
minibatch, prompt_batch x n / (minibatches x workers x grad_accum) rows (256 at the defaults), with
every decoder layer's activations kept for the backward; a 1.5 B model of Qwen2.5's shape keeps
about 3.4 MiB of them a token (124 KiB a token and layer, 28 layers, measured under bf16 autocast),
so 256 rows of 300 tokens need some 250 GiB.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config.models_section import ModelConfig, TrainerConfig
from workers.zoo.packaged import locate

REAL_PARAMETERS = 50_000_000
"""From this many parameters a model is a real LM, not a zoo-sized one."""
TOY_NEW_TOKENS = 64
"""``generation.max_new_tokens`` at or below this is a smoke-test budget, not a training run's."""
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


SCORE_ROWS = 256
"""Rows of a scoring forward without a token budget (``workers.training.trainer.SCORE_ROWS``)."""


def _is_real(path: str | Path | None) -> bool:
    """A model given by ``path`` that is a real LM, or whose size is unknown here (a hub id: its
    files are not read at load); a zoo model (``builder``, no path) is not."""
    if path is None:
        return False
    params = estimated_parameters(path)
    return params is None or params >= REAL_PARAMETERS


def _config_parameters(config: dict) -> int | None:
    width = config.get("hidden_size", config.get("n_embd", config.get("d_model")))
    layers = config.get("num_hidden_layers", config.get("n_layer", config.get("num_layers")))
    vocab = config.get("vocab_size", 0)
    if not isinstance(width, int) or not isinstance(layers, int):
        return None
    return 12 * layers * width * width + int(vocab) * width


def estimated_parameters(path: str | Path) -> int | None:
    """The parameter count of the model at ``path`` (a folder, a ``.gguf`` file or a
    ``package:`` reference), estimated as the module docstring says; None when unknown."""
    try:
        target = locate(path)
    except ValueError:
        return None
    if target.is_file():
        return target.stat().st_size if target.suffix == ".gguf" else None
    config_file = target / "config.json"
    if config_file.is_file():
        try:
            counted = _config_parameters(json.loads(config_file.read_text()))
        except (OSError, ValueError):
            counted = None
        if counted is not None:
            return counted
    weights = [f for f in target.iterdir() if f.suffix in WEIGHT_SUFFIXES] if target.is_dir() else []
    return sum(f.stat().st_size for f in weights) // 2 if weights else None


def toy_budget_warnings(models: list[ModelConfig]) -> list[str]:
    """One line per real model (by ``path``) whose replicas run on CPU (``generation.num_gpus``
    0) with a smoke-test budget (``generation.max_new_tokens`` <= :data:`TOY_NEW_TOKENS`)."""
    lines = []
    for i, model in enumerate(models):
        gen = model.generation
        if model.path is None or gen.num_gpus > 0 or gen.max_new_tokens > TOY_NEW_TOKENS:
            continue
        params = estimated_parameters(model.path)
        if params is None or params < REAL_PARAMETERS:
            continue
        lines.append(f"models.{i} ({model.name}): a real model (estimated {params / 1e6:.0f} M parameters) runs on CPU "
                     f"(generation.num_gpus: 0, trainer.num_gpus: {model.trainer.num_gpus:g}) with "
                     f"generation.max_new_tokens: {gen.max_new_tokens}: a smoke test, not a training run. On GPUs set "
                     f"models.{i}.generation.num_gpus and models.{i}.trainer.num_gpus (e.g. 1) and a real budget "
                     f"(models.{i}.generation.max_new_tokens, e.g. 1024 or more)")
    return lines


def vocab_size(path: str | Path) -> int | None:
    """``vocab_size`` of the transformers ``config.json`` at ``path`` (None when unknown)."""
    try:
        config = json.loads((locate(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    vocab = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    return vocab if isinstance(vocab, int) else None


def full_logits_warnings(models: list[ModelConfig], prompt_batch: int, n: int) -> list[str]:
    """One line per model whose trainer is on a GPU, forms whole-vocabulary logits (ZeRO-3, or
    ``logprob_chunk_tokens`` null) and has no ``max_tokens_per_micro_batch``: the fp32 log-softmax
    of one scoring forward, min(256, prompt_batch x n) rows x ``max_new_tokens`` x V x 4 bytes
    (V from the folder's config.json, else 128,000), the prompt not counted."""
    lines = []
    for i, model in enumerate(models):
        tr = model.trainer
        if not tr.num_gpus or not _full_logits(tr) or tr.max_tokens_per_micro_batch is not None:
            continue
        vocab = (vocab_size(model.path) if model.path is not None else None) or 128_000
        rows, tokens = min(SCORE_ROWS, prompt_batch * n), model.generation.max_new_tokens
        gib = rows * tokens * vocab * 4 / 2**30
        why = "DeepSpeed ZeRO-3 runs its engine's whole forward" if tr.logprob_chunk_tokens is not None \
            else "trainer.logprob_chunk_tokens is null"
        lines.append(f"models.{i} ({model.name}): its trainer forms whole-vocabulary logits on the GPU ({why}) and "
                     f"models.{i}.trainer.max_tokens_per_micro_batch is not set, so a scoring forward takes {rows} rows: "
                     f"at {tokens} new tokens and a {vocab:,}-token vocabulary their fp32 log-softmax alone is "
                     f"{gib:,.1f} GiB. {_set_budget(i)}")
    return lines


def _set_budget(i: int) -> str:
    """What both warnings tell the user to set."""
    return (f"Set models.{i}.trainer.max_tokens_per_micro_batch (tokens per rank per forward, e.g. the longest "
            "prompt + response) and trainer.gradient_checkpointing: true")


def _full_logits(trainer: TrainerConfig) -> bool:
    """The trainer forms whole-vocabulary logits (ZeRO-3's engine forward, or no LM-head chunks)."""
    return (trainer.backend == "deepspeed" and trainer.deepspeed.zero_stage == 3) or trainer.logprob_chunk_tokens is None


def update_budget_warnings(models: list[ModelConfig], prompt_batch: int, n: int, minibatches: int) -> list[str]:
    """One line per real model (or one of unknown size) whose trainer is on a GPU with no
    ``max_tokens_per_micro_batch`` and is not already named by :func:`full_logits_warnings`: each
    update's forward takes ceil(prompt_batch x n / (minibatches x workers x grad_accum)) rows of up
    to the prompt + ``max_new_tokens`` tokens, their activations kept for the backward."""
    lines = []
    for i, model in enumerate(models):
        tr = model.trainer
        if not tr.num_gpus or tr.max_tokens_per_micro_batch is not None or _full_logits(tr) or not _is_real(model.path):
            continue
        rows = -(-prompt_batch * n // (minibatches * tr.workers * tr.grad_accum))
        tokens = model.generation.max_new_tokens
        kept = "" if tr.gradient_checkpointing else " (each decoder layer's: trainer.gradient_checkpointing is off)"
        lines.append(
            f"models.{i} ({model.name}): its trainer is on a GPU and models.{i}.trainer.max_tokens_per_micro_batch is not "
            f"set, so each update's forward takes {rows} rows (algorithm.prompt_batch x n / (minibatches x "
            f"trainer.workers x trainer.grad_accum)) of up to the prompt + {tokens} new tokens, {rows * tokens:,} "
            f"response tokens with their activations kept for the backward{kept}: for a 1-3 B model far more than a "
            f"GPU holds (about 3.4 MiB a token at 1.5 B without checkpointing). {_set_budget(i)}")
    return lines
