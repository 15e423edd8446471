"""Request fields ``graftpool serve`` does not honour beyond the twenty-ninth read's list: the
openai client against a real Ray Serve app on 127.0.0.1.

The twenty-ninth read made a field the backends do not honour a 400 naming it, for the fields it
listed (``logprobs``, the penalties, ``tools``, ...). ``seed`` (OpenAI's reproducible sampling),
``functions`` / ``function_call`` (the older form of ``tools``, which the openai client still
sends) and the sampling extensions vLLM's own server takes in the body (``top_k``, ``min_p``,
``repetition_penalty``, ...) were still ignored without a word: a request with ``seed=7`` got
unseeded samples, one with ``functions`` a plain text answer (issue #51's thirtieth read). Now
each is a 400 naming it; a field that asks nothing of the sampler (``user``) is still served."""

from __future__ import annotations

import pytest

from tests.served_llama32 import served_client


def test_seed_functions_and_vllm_sampling_extensions_are_refused_by_name(tmp_path, ray_local):
    from openai import BadRequestError

    with served_client(tmp_path) as client:
        ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "max_completion_tokens": 4}
        assert client.chat.completions.create(**ask, user="someone").choices[0].message.content is not None
        with pytest.raises(BadRequestError, match="seed"):
            client.chat.completions.create(**ask, seed=7)
        with pytest.raises(BadRequestError, match="functions"):
            client.chat.completions.create(**ask, functions=[{"name": "add", "parameters": {"type": "object"}}])
        with pytest.raises(BadRequestError, match="top_k"):
            client.completions.create(model="llama32", prompt="12+35=", max_tokens=4, extra_body={"top_k": 5})
