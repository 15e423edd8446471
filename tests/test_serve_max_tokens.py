"""How long a served chat answer may be: ``graftpool serve``'s chat route against the openai
client, a real Ray Serve app on 127.0.0.1.

The route read ``max_tokens`` only and defaulted to 16 tokens, the legacy completions route's
default. Current openai clients send a chat request's limit as ``max_completion_tokens`` (OpenAI
marks ``max_tokens`` deprecated there), and OpenAI and vLLM bound a chat answer by the context when
no limit is sent; so a user reaching the served run from a laptop with the client the docs name got
every answer cut at 16 tokens, whatever they asked for (issue #51's twenty-eighth read). Now a chat
request's limit is ``max_completion_tokens``, else ``max_tokens``, else the run's
``models[].generation.max_new_tokens`` for that model."""

from __future__ import annotations

from tests.served_llama32 import NEW_TOKENS, served_client


def test_a_served_chat_answer_takes_max_completion_tokens_and_defaults_to_the_runs_length(tmp_path, ray_local):
    with served_client(tmp_path) as client:
        messages = [{"role": "user", "content": "12+35="}]
        asked = client.chat.completions.create(model="llama32", messages=messages, temperature=0,
                                               max_completion_tokens=20)
        unbounded = client.chat.completions.create(model="llama32", messages=messages, temperature=0)
        legacy = client.chat.completions.create(model="llama32", messages=messages, temperature=0, max_tokens=5)
        completion = client.completions.create(model="llama32", prompt="12+35=", temperature=0)
    assert asked.usage.completion_tokens == 20, asked.usage
    assert unbounded.usage.completion_tokens == NEW_TOKENS, unbounded.usage
    assert legacy.usage.completion_tokens == 5, legacy.usage
    assert completion.usage.completion_tokens == 16, "the completions route keeps OpenAI's default of 16"
    assert all(r.choices[0].finish_reason == "length" for r in (asked, unbounded, legacy))
