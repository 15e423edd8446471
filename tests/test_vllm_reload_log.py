"""A weight sync into a vLLM replica logs no failure where none happened (``workers/rollout/vllm_logs.py``).

vLLM 0.32's in-place reload warns "<class>: Failed to load weights" for every module that got no
tensor from the sync: the rotary embedding, which holds only a cache computed at start-up, and a
tied LM head (this model's, as Llama 3.2's), whose weight is the embedding's and is refilled with
it. On the GPU template those are WARNINGs every step in the job's output. The replica filters them
for modules that own no weight; a module owning one that a sync leaves out is still warned about, the
embedding a tied head shares included (a weight held by two modules is the first one's).
The engine is vLLM's CPU build in a Ray task of its own (``.venv-scale``; skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from tests.scale_setup import needs_vllm
from workers.rollout.vllm_logs import weightless_classes

pytestmark = pytest.mark.slow


def _sync_warnings(path: str) -> dict[str, list[str]]:
    """In a process of its own: a replica of ``path``, synced twice (its own weights whole, then
    without ``model.norm.weight``); the reload logger's warnings of each sync as its handlers get
    them, and whether greedy outputs survived the whole sync."""
    import logging

    from safetensors.torch import load_file

    from workers.rollout.generation import SamplingParams
    from workers.rollout.vllm_generation import VLLMGeneration
    from workers.rollout.vllm_logs import LAYERWISE_LOGGER

    replica = VLLMGeneration(path, seed=3, gpu_memory_utilization=0.15, kv_cache_space_gb=1, chat_template="none")
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger(LAYERWISE_LOGGER).addHandler(handler)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=12)
    before = [c.token_ids for c in replica.generate(["12+3=", "7*8="], greedy)]
    weights = load_file(f"{path}/model.safetensors")
    replica.load_weights(weights, 1)
    whole = list(seen)
    after = [c.token_ids for c in replica.generate(["12+3=", "7*8="], greedy)]
    seen.clear()
    replica.load_weights({k: v for k, v in weights.items() if k != "model.norm.weight"}, 2)
    partial = list(seen)
    seen.clear()
    replica.load_weights({k: v for k, v in weights.items() if k != "model.embed_tokens.weight"}, 3)
    return {"whole": whole, "partial": partial, "no_embedding": list(seen), "same": [str(before == after)]}


@needs_vllm
def test_a_weight_sync_logs_no_failure_for_the_rotary_embedding_or_a_tied_head_but_still_for_a_missed_weight(ray_local, h64_path):
    task = ray_local.remote(max_calls=1, num_cpus=1)(_sync_warnings)
    result = ray_local.get(task.remote(str(h64_path)))
    assert result["same"] == ["True"], "the sync of the model's own weights changed its outputs"
    assert not [m for m in result["whole"] if "Failed to load weights" in m], result["whole"]
    assert any(m.endswith("RMSNorm: Failed to load weights") for m in result["partial"]), result["partial"]
    # the tied embedding owns the weight its LM head shares: a sync that misses it is warned about
    assert any(m.endswith("VocabParallelEmbedding: Failed to load weights") for m in result["no_embedding"]), \
        result["no_embedding"]


class TiedHead(torch.nn.Module):
    """An LM head whose weight is the embedding's (``tie_word_embeddings``, as vLLM ties it)."""

    def __init__(self, embedding: torch.nn.Embedding):
        super().__init__()
        self.weight = embedding.weight


def test_a_tied_embedding_owns_its_weight_and_only_its_head_and_buffer_holders_are_weightless():
    """Qwen2.5-3B and Llama-3.2-3B both tie their LM head to the embedding: the embedding's
    "Failed to load weights" is a real failure (the sync missed the weight both use), the head's
    is not."""
    model = torch.nn.Module()
    model.embed_tokens = torch.nn.Embedding(16, 4)
    model.norm = torch.nn.LayerNorm(4)
    model.rotary = torch.nn.Module()
    model.rotary.register_buffer("cos_sin_cache", torch.zeros(8, 4))
    model.lm_head = TiedHead(model.embed_tokens)
    assert weightless_classes(model) == ["Module", "TiedHead"]
