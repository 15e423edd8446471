"""``graftpool serve`` against the openai client and plain HTTP: one real Ray Serve app on 127.0.0.1
(``tests/served_llama32.py``: a Llama-3.2-base-shaped model's run folder), started once for the
module's tests, which each send it their own requests (none changes what the app serves).

Each test's docstring says what issue #51's read found and what it holds now; they were eight modules,
each starting the same app (about 20 s each under the suite's load), until issue #54 asked for the
suite's time."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.served_llama32 import NEW_TOKENS, served_client


class Served(NamedTuple):
    client: Any  # openai.OpenAI, without retries
    run_dir: Path  # the served run folder


@pytest.fixture(scope="module")
def served(tmp_path_factory, ray_local) -> Iterator[Served]:
    """The app's openai client and its run folder; the app is shut down after the module."""
    root = tmp_path_factory.mktemp("served")
    with served_client(root) as client:
        yield Served(client, root / "runs" / "served")


def test_a_served_chat_answer_takes_max_completion_tokens_and_defaults_to_the_runs_length(served):
    """How long a served chat answer may be: ``graftpool serve``'s chat route against the openai
    client, a real Ray Serve app on 127.0.0.1.

    The route read ``max_tokens`` only and defaulted to 16 tokens, the legacy completions route's
    default. Current openai clients send a chat request's limit as ``max_completion_tokens`` (OpenAI
    marks ``max_tokens`` deprecated there), and OpenAI and vLLM bound a chat answer by the context when
    no limit is sent; so a user reaching the served run from a laptop with the client the docs name got
    every answer cut at 16 tokens, whatever they asked for (issue #51's twenty-eighth read). Now a chat
    request's limit is ``max_completion_tokens``, else ``max_tokens``, else the run's
    ``models[].generation.max_new_tokens`` for that model."""
    client = served.client
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


def test_a_streamed_request_gets_the_answer_as_events(served):
    """A streamed request to ``graftpool serve``: the openai client with ``stream=True``, a real Ray
    Serve app on 127.0.0.1.

    The routes ignored ``stream`` and answered JSON; the openai client reads a streamed answer as
    server-sent events only, so every ``stream=True`` call (what chat front-ends and most client
    code send) got an empty stream: no text, no error, from an endpoint operations.md says any OpenAI
    client works with (issue #51's twenty-ninth read). Now a streamed request gets the answer as
    events, the same text as the unstreamed request's."""
    client = served.client
    ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "temperature": 0,
           "max_completion_tokens": 12}
    whole = client.chat.completions.create(**ask)
    chunks = list(client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True}))
    prompt = {"model": "llama32", "prompt": "12+35=", "temperature": 0, "max_tokens": 8}
    completion = client.completions.create(**prompt)
    parts = list(client.completions.create(**prompt, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content and text == whole.choices[0].message.content, (text, chunks)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert "".join(p.choices[0].text for p in parts) == completion.choices[0].text != ""


def test_stop_strings_cut_the_answer_and_an_unsupported_field_is_refused(served):
    """``stop`` and the request fields ``graftpool serve`` does not honour: the openai client against
    a real Ray Serve app on 127.0.0.1.

    The routes read ``model``, the prompt or messages, the length, ``n``, ``temperature`` and
    ``top_p`` and silently ignored the rest: a request with ``stop=[...]`` got the text past its stop
    strings with ``finish_reason`` ``length``, and one with ``presence_penalty``, ``logprobs`` or
    ``tools`` an answer that had honoured none of them, from an endpoint operations.md says any
    OpenAI client works with (issue #51's twenty-ninth read). Now a text is cut before its first stop
    string (``finish_reason`` ``stop``, the tokens counted up to it), and a field the backends do not
    honour is a 400 naming it."""
    from openai import BadRequestError

    client = served.client
    ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "temperature": 0,
           "max_completion_tokens": 12}
    whole = client.chat.completions.create(**ask)
    text = whole.choices[0].message.content
    stop = text[4:6]
    assert len(text) > 6 and stop, text
    cut = client.chat.completions.create(**ask, stop=[stop, "no such text"])
    with_empty = client.chat.completions.create(**ask, stop=["", stop])  # an empty string stops nothing
    prompt = {"model": "llama32", "prompt": "12+35=", "temperature": 0, "max_tokens": 12}
    completion = client.completions.create(**prompt).choices[0].text
    cut_completion = client.completions.create(**prompt, stop=completion[4:6]).choices[0]
    assert cut.choices[0].message.content == text[:text.find(stop)], (text, stop, cut)
    assert cut.choices[0].finish_reason == "stop" and whole.choices[0].finish_reason == "length"
    assert with_empty.choices[0].message.content == cut.choices[0].message.content, with_empty
    assert 0 < cut.usage.completion_tokens < whole.usage.completion_tokens
    assert cut_completion.text == completion[:completion.find(completion[4:6])]
    assert cut_completion.finish_reason == "stop"
    with pytest.raises(BadRequestError, match="presence_penalty"):
        client.chat.completions.create(**ask, presence_penalty=0.5)
    with pytest.raises(BadRequestError, match="logprobs"):
        client.completions.create(**prompt, logprobs=2)


def test_seed_functions_and_vllm_sampling_extensions_are_refused_by_name(served):
    """Request fields ``graftpool serve`` does not honour beyond the twenty-ninth read's list: the
    openai client against a real Ray Serve app on 127.0.0.1.

    The twenty-ninth read made a field the backends do not honour a 400 naming it, for the fields it
    listed (``logprobs``, the penalties, ``tools``, ...). ``seed`` (OpenAI's reproducible sampling),
    ``functions`` / ``function_call`` (the older form of ``tools``, which the openai client still
    sends) and the sampling extensions vLLM's own server takes in the body (``top_k``, ``min_p``,
    ``repetition_penalty``, ...) were still ignored without a word: a request with ``seed=7`` got
    unseeded samples, one with ``functions`` a plain text answer (issue #51's thirtieth read). Now
    each is a 400 naming it; a field that asks nothing of the sampler (``user``) is still served."""
    from openai import BadRequestError

    client = served.client
    ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "max_completion_tokens": 4}
    assert client.chat.completions.create(**ask, user="someone").choices[0].message.content is not None
    with pytest.raises(BadRequestError, match="seed"):
        client.chat.completions.create(**ask, seed=7)
    with pytest.raises(BadRequestError, match="functions"):
        client.chat.completions.create(**ask, functions=[{"name": "add", "parameters": {"type": "object"}}])
    with pytest.raises(BadRequestError, match="top_k"):
        client.completions.create(model="llama32", prompt="12+35=", max_tokens=4, extra_body={"top_k": 5})


def test_a_field_serve_does_not_know_is_refused_by_name(served):
    """Request fields ``graftpool serve`` does not know: the openai client against a real Ray Serve
    app on 127.0.0.1.

    The thirtieth read refused the fields it listed (``seed``, ``top_k``, ...) and operations.md said
    "vLLM's sampling extensions" were refused; any field not on the list was still ignored without a
    word. vLLM's own server takes ``guided_choice`` / ``guided_json`` (constrained decoding),
    ``stop_token_ids``, ``include_stop_str_in_output``, ``use_beam_search`` in the body, so a request
    with ``extra_body={"guided_choice": ["yes", "no"]}`` got an unconstrained answer with status 200
    (issue #51's thirty-first read). Now a field serve does not know is a 400 naming it; the fields
    that ask nothing of the sampler (``user``, ``metadata``, ``store``) are still served."""
    from openai import BadRequestError

    client = served.client
    ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "max_completion_tokens": 4}
    served = client.chat.completions.create(**ask, user="someone", metadata={"k": "v"}, store=False)
    assert served.choices[0].message.content is not None
    with pytest.raises(BadRequestError, match="guided_choice"):
        client.chat.completions.create(**ask, extra_body={"guided_choice": ["yes", "no"]})
    with pytest.raises(BadRequestError, match="include_stop_str_in_output"):
        client.completions.create(model="llama32", prompt="12+35=", max_tokens=4, stop="3",
                                  extra_body={"include_stop_str_in_output": True})


def test_text_parts_are_served_as_the_plain_content_and_null_sampling_fields_as_defaults(served):
    """A chat request as the openai client's typed form sends it: ``graftpool serve`` against the
    openai client, a real Ray Serve app on 127.0.0.1.

    The chat route gave each message's ``content`` to the chat template as it came. The openai client
    (and the tools built on it) may send a content as parts, ``[{"type": "text", "text": ...}]``: a
    Llama 3 template rendered the list as its Python repr, so the model answered a prompt the user
    never wrote, with status 200 (Qwen2.5's template failed with a 500). And ``temperature=None`` /
    ``top_p=None``, sent as ``null``, which OpenAI takes as its default, was a 500 (``float(None)``)
    (issue #51's thirty-first read). Now text parts are joined into the string a plain content is, a
    part that is not text is a 400 naming its type, and a null sampling field is its default."""
    from openai import BadRequestError

    client = served.client
    ask = {"model": "llama32", "max_completion_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**ask, messages=[{"role": "user", "content": "12+35="}])
    parts = client.chat.completions.create(
        **ask, messages=[{"role": "user", "content": [{"type": "text", "text": "12+35="}]}])
    assert parts.usage.prompt_tokens == plain.usage.prompt_tokens
    assert parts.choices[0].message.content == plain.choices[0].message.content
    with pytest.raises(BadRequestError, match="image_url"):
        client.chat.completions.create(**ask, messages=[{"role": "user", "content": [
            {"type": "text", "text": "12+35="}, {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    unset = client.chat.completions.create(model="llama32", max_completion_tokens=4, temperature=None,
                                           top_p=None, messages=[{"role": "user", "content": "12+35="}])
    assert unset.choices[0].message.content is not None


def test_a_prompt_of_token_ids_is_a_400_not_a_500(served):
    """The completions route took ``prompt=[[1, 2, 3]]`` or ``[1, 2, 3]`` (token ids, which OpenAI
    and vLLM take) into a text backend and answered 500; now a 400 says it takes text."""
    from openai import BadRequestError

    client = served.client
    with pytest.raises(BadRequestError, match="token ids"):
        client.completions.create(model="llama32", prompt=[1, 2, 3], max_tokens=4)
    assert client.completions.create(model="llama32", prompt=["12+35="], max_tokens=4).choices[0].text is not None


def test_malformed_requests_are_400s_naming_the_field(served):
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
    import requests
    from openai import BadRequestError

    def post(url: str, body) -> tuple[int, str]:
        data = body if isinstance(body, str) else json.dumps(body)
        reply = requests.post(url, data=data, headers={"content-type": "application/json"}, timeout=120)
        error = reply.json().get("error", {}) if reply.headers.get("content-type", "").startswith("application/json") else {}
        return reply.status_code, f"{error.get('type')}: {error.get('message', reply.text)}"

    client = served.client
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


def test_the_completions_route_refuses_the_chat_routes_length_field(served):
    from openai import BadRequestError

    client = served.client
    with pytest.raises(BadRequestError, match="max_completion_tokens"):
        client.completions.create(model="llama32", prompt="12+35=", extra_body={"max_completion_tokens": 30})
    with pytest.raises(BadRequestError, match="prompt"):
        client.chat.completions.create(model="llama32", messages=[{"role": "user", "content": "12+35="}],
                                       max_completion_tokens=4, extra_body={"prompt": "12+35="})
    served = client.completions.create(model="llama32", prompt="12+35=", max_tokens=30, temperature=0)
    assert served.usage.completion_tokens == 30


def test_a_length_past_the_context_is_a_400_and_a_default_is_cut_to_it(served):
    """A request's length against the model's context: ``graftpool serve`` on the ``hf`` backend (a CPU
    serve, as of the GPU template's 3 B models on the head), a real Ray Serve app on 127.0.0.1 and the
    openai client (issue #51's thirty-third read).

    The ``hf`` backend had no bound of its own: a ``max_tokens`` past the context was sampled (its cache
    reserving prompt + max_tokens positions a row at the first token, 7.4 GB a row of Qwen2.5-3B in fp32
    at 100,000, computed), past the model's positions, with status 200. vLLM and OpenAI answer such a
    request with a 400; a length the request did not ask (the route's default) is cut to the context."""
    from openai import BadRequestError
    from transformers import AutoTokenizer

    client = served.client
    folder = served.run_dir / "final" / "llama32"
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
