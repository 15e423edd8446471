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

from pathlib import Path

import yaml

from tests.llama3_style import build_llama32_base

NEW_TOKENS = 24  # the run's max_new_tokens: a served chat answer's default length


def _run_folder(root: Path) -> Path:
    """A run folder as ``graftpool serve`` reads it: ``config.yaml`` and ``final/<model>``. The
    Llama-3.2-base-shaped model runs greedily past 24 tokens without a stop token."""
    run_dir = root / "runs" / "served"
    build_llama32_base(run_dir / "final" / "llama32")
    config = {"models": [{"name": "llama32", "chat_template": "auto",
                          "generation": {"max_new_tokens": NEW_TOKENS, "num_gpus": 0}}]}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


def test_a_served_chat_answer_takes_max_completion_tokens_and_defaults_to_the_runs_length(tmp_path, ray_local):
    from openai import OpenAI
    from ray import serve

    from orchestrator.serving.serve import start_serving
    from tests.netcut import free_port

    url = start_serving(_run_folder(tmp_path), free_port())
    try:
        client = OpenAI(base_url=url, api_key="unused", max_retries=0)
        messages = [{"role": "user", "content": "12+35="}]
        asked = client.chat.completions.create(model="llama32", messages=messages, temperature=0,
                                               max_completion_tokens=20)
        unbounded = client.chat.completions.create(model="llama32", messages=messages, temperature=0)
        legacy = client.chat.completions.create(model="llama32", messages=messages, temperature=0, max_tokens=5)
        completion = client.completions.create(model="llama32", prompt="12+35=", temperature=0)
    finally:
        serve.shutdown()
    assert asked.usage.completion_tokens == 20, asked.usage
    assert unbounded.usage.completion_tokens == NEW_TOKENS, unbounded.usage
    assert legacy.usage.completion_tokens == 5, legacy.usage
    assert completion.usage.completion_tokens == 16, "the completions route keeps OpenAI's default of 16"
    assert all(r.choices[0].finish_reason == "length" for r in (asked, unbounded, legacy))
