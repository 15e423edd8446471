"""A prompt of no tokens, and a length past the context of a model without a chat template:
``graftpool serve`` against the openai client, a real Ray Serve app on 127.0.0.1 (issue #51's
thirty-third read; ``tests/test_serve_openai.py`` has the context on a Llama-3.2-shaped model).

A completion's ``prompt: ""`` for a tokenizer that adds no BOS (Qwen2.5's, gpt2's, the demo's), or a
chat whose rendering is empty (a model without a chat template and no user message), crashed the
``hf`` backend: a bare 500, which the openai client sends twice more. A ``max_tokens`` past the
context ran a RoPE model past its ``max_position_embeddings``, silently, with status 200 (a gpt2's
learned positions and a vLLM engine refused it with a 500). vLLM's server answers each with a 400;
so does serve now, and a chat length the request did not set is cut to the room left."""

from __future__ import annotations

import pytest

from tests.served_run import served_run_folder

CONTEXT = 128  # the demo model's builder.max_positions
MODEL = "llama-char"


def test_an_empty_prompt_is_a_400_and_an_unset_chat_length_is_cut_to_the_room_left(tmp_path, ray_local):
    from openai import BadRequestError, OpenAI
    from ray import serve

    from orchestrator.serving.serve import start_serving
    from tests.netcut import free_port

    url = start_serving(served_run_folder(tmp_path, "context"), free_port())
    try:
        client = OpenAI(base_url=url, api_key="unused", max_retries=0)
        with pytest.raises(BadRequestError, match="the prompt is empty"):
            client.completions.create(model=MODEL, prompt="", max_tokens=4)
        with pytest.raises(BadRequestError, match="the prompt is empty"):  # no template: the last user message
            client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": "be brief"}],
                                           max_tokens=4)
        with pytest.raises(BadRequestError, match=f"maximum context length is {CONTEXT} tokens"):
            client.completions.create(model=MODEL, prompt="12+35=", max_tokens=200, temperature=0)
        fits = client.completions.create(model=MODEL, prompt="12+35=", max_tokens=CONTEXT - 6, temperature=0)
        assert fits.usage.prompt_tokens == 6
        # the run's max_new_tokens (32), unasked, cut to the room a 120-token prompt leaves
        long = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "1+" * 60}],
                                              temperature=0)
        assert long.usage.prompt_tokens + long.usage.completion_tokens <= CONTEXT, long.usage
    finally:
        serve.shutdown()
