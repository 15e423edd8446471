"""Malformed requests and the other route's fields: ``graftpool serve`` against the openai client and
plain HTTP, a real Ray Serve app on 127.0.0.1 (issue #51's thirty-second read).

A chat request without ``messages`` (or with a string for them, or a content list of strings), a
completion without ``prompt`` (or with the chat route's ``messages`` instead), a ``stop`` that is a
number, a ``temperature`` that is a string, a body that is not JSON: each reached the backends and
got a bare ``500 Internal Server Error``, which the openai client sends twice more before raising
``InternalServerError``; OpenAI and vLLM answer them with a 400 naming the field. A length or ``n``
of 0 was served as the default (``max_completion_tokens: 0`` gave the run's 24 tokens). And the
completions route took ``max_completion_tokens`` (a chat field, served) and ignored it: the answer
was cut at 16 tokens with status 200. Now each is a 400 naming the field."""

from __future__ import annotations

import json

import pytest

from tests.served_llama32 import served_client


def test_malformed_requests_are_400s_naming_the_field(tmp_path, ray_local):
    import requests
    from openai import BadRequestError

    def post(url: str, body) -> tuple[int, str]:
        data = body if isinstance(body, str) else json.dumps(body)
        reply = requests.post(url, data=data, headers={"content-type": "application/json"}, timeout=120)
        error = reply.json().get("error", {}) if reply.headers.get("content-type", "").startswith("application/json") else {}
        return reply.status_code, f"{error.get('type')}: {error.get('message', reply.text)}"

    with served_client(tmp_path) as client:
        base = str(client.base_url).rstrip("/")
        one = [{"role": "user", "content": "12+35="}]
        chat = {"model": "llama32", "max_completion_tokens": 4}
        for body, field in (({**chat}, "'messages'"),
                            ({**chat, "messages": "12+35="}, "'messages"),
                            ({**chat, "messages": [{"role": "user", "content": ["12+35="]}]}, "'messages.0.content'"),
                            ({**chat, "messages": one, "stop": 5}, "'stop'"),
                            ({**chat, "messages": one, "temperature": "hot"}, "'temperature'"),
                            ({**chat, "messages": one, "max_completion_tokens": 0}, "'max_completion_tokens'"),
                            ({**chat, "messages": one, "n": 0}, "'n'"),
                            ("{not json", "not JSON")):
            status, message = post(f"{base}/chat/completions", body)
            assert (status, field in message, message.startswith("invalid_request_error")) == (400, True, True), \
                (body, status, message)
        for body, field in (({"model": "llama32", "max_tokens": 4}, "'prompt'"),
                            ({"model": "llama32", "messages": one, "max_tokens": 4}, "'prompt'"),
                            ({"model": "llama32", "prompt": [], "max_tokens": 4}, "'prompt'")):
            status, message = post(f"{base}/completions", body)
            assert (status, field in message) == (400, True), (body, status, message)
        with pytest.raises(BadRequestError, match="'prompt'"):  # not InternalServerError, after two retries
            client.completions.create(model="llama32", prompt=None, max_tokens=4)
        ok = client.chat.completions.create(**chat, messages=one, temperature=0)
        assert ok.choices[0].message.content is not None


def test_the_completions_route_refuses_the_chat_routes_length_field(tmp_path, ray_local):
    from openai import BadRequestError

    with served_client(tmp_path) as client:
        with pytest.raises(BadRequestError, match="max_completion_tokens"):
            client.completions.create(model="llama32", prompt="12+35=", extra_body={"max_completion_tokens": 30})
        with pytest.raises(BadRequestError, match="prompt"):
            client.chat.completions.create(model="llama32", messages=[{"role": "user", "content": "12+35="}],
                                           max_completion_tokens=4, extra_body={"prompt": "12+35="})
        served = client.completions.create(model="llama32", prompt="12+35=", max_tokens=30, temperature=0)
        assert served.usage.completion_tokens == 30
