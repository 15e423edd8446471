"""A request's length against the model's context: ``graftpool serve`` on the ``hf`` backend (a CPU
serve, as of the GPU template's 3 B models on the head), a real Ray Serve app on 127.0.0.1 and the
openai client (issue #51's thirty-third read).

The ``hf`` backend had no bound of its own: a ``max_tokens`` past the context was sampled (its cache
reserving prompt + max_tokens positions a row at the first token, 7.4 GB a row of Qwen2.5-3B in fp32
at 100,000, computed), past the model's positions, with status 200. vLLM and OpenAI answer such a
request with a 400; a length the request did not ask (the route's default) is cut to the context."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.served_llama32 import served_client


def test_a_length_past_the_context_is_a_400_and_a_default_is_cut_to_it(tmp_path, ray_local):
    from openai import BadRequestError
    from transformers import AutoTokenizer

    with served_client(tmp_path) as client:
        folder = Path(tmp_path) / "runs" / "served" / "final" / "llama32"
        context = json.loads((folder / "config.json").read_text())["max_position_embeddings"]
        with pytest.raises(BadRequestError, match=f"maximum context length is {context} tokens"):
            client.chat.completions.create(model="llama32", messages=[{"role": "user", "content": "12+35="}],
                                           max_completion_tokens=4 * context, temperature=0)
        with pytest.raises(BadRequestError, match="maximum context length"):
            client.completions.create(model="llama32", prompt="12+35=", max_tokens=context, temperature=0)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompt = "12+35="
        while len(tokenizer(prompt)["input_ids"]) < context - 8:  # the default 16 tokens do not fit
            prompt += " 12+35="
        room = context - len(tokenizer(prompt)["input_ids"])
        served = client.completions.create(model="llama32", prompt=prompt, temperature=0)
        assert 1 <= room < 16 and served.usage.completion_tokens <= room, (room, served.usage)
