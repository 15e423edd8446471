"""The OpenAI wire format as ``graftpool serve`` speaks it (``orchestrator/serving/serve.py``):
error bodies, a chat message's content, usage, server-sent events for ``stream: true``, and the
request fields served or refused."""

import json
from collections.abc import Iterator

from fastapi.responses import JSONResponse, StreamingResponse


def error_response(status: int, message: str, code: str) -> JSONResponse:
    """OpenAI's error body, which the openai client raises as ``BadRequestError`` (400) and the like."""
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "code": code}}, status)


def text_messages(messages: list[dict]) -> list[dict] | JSONResponse:
    """The messages with each content given as parts (``[{"type": "text", "text": ...}, ...]``,
    the openai client's typed form) joined into one string, ``"\n".join(texts)`` as vLLM's server
    joins them: the chat templates render a string (a list reached Llama 3's as its Python repr;
    Qwen2.5's was read, not run, to fail on it). A part that is not text is a 400 naming its type."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            kinds = sorted({str(part.get("type")) for part in content if part.get("type") != "text"})
            if kinds:
                return error_response(400, f"graftpool serve takes text content only, not {', '.join(kinds)}",
                                      "unsupported_content")
            message = {**message, "content": "\n".join(part.get("text", "") for part in content)}
        out.append(message)
    return out


def usage_of(results: list[dict]) -> dict:
    """OpenAI's ``usage``: prompt tokens, completion tokens (every choice's) and their sum."""
    prompt = sum(r["prompt_tokens"] for r in results)
    completion = sum(sum(r["tokens"]) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse_events(response: dict, chunk_object: str, body: dict) -> Iterator[str]:
    """A whole answer as OpenAI's server-sent events, for a request with ``stream: true``: one
    chunk per choice (chat: ``delta`` with the role and the whole text, then an empty ``delta``
    with the finish reason), the usage chunk where ``stream_options.include_usage`` asks for it,
    then ``data: [DONE]``. The answer is sampled whole before the first event (the backends
    return whole responses), so a stream's first token comes with its last."""
    head = {"id": response["id"], "object": chunk_object, "created": response["created"], "model": response["model"]}
    for choice in response["choices"]:
        if "message" in choice:
            for delta, finish in ((choice["message"], None), ({}, choice["finish_reason"])):
                yield sse_event({**head, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": finish}]})
        else:
            yield sse_event({**head, "choices": [choice]})
    if (body.get("stream_options") or {}).get("include_usage"):
        yield sse_event({**head, "choices": [], "usage": response["usage"]})
    yield "data: [DONE]\n\n"


def sse_event(chunk: dict) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


def answer_as_requested(response: dict, chunk_object: str, body: dict) -> dict | StreamingResponse:
    """The response as JSON, or as server-sent events where the request has ``stream: true``
    (the openai client then reads events only: a JSON body is an empty stream to it)."""
    if not body.get("stream"):
        return response
    return StreamingResponse(sse_events(response, chunk_object, body), media_type="text/event-stream")


UNSUPPORTED = {"logprobs": (None, False, 0), "top_logprobs": (None, 0), "presence_penalty": (None, 0),
               "frequency_penalty": (None, 0), "logit_bias": (None, {}), "tools": (None, []), "tool_choice": (None, "none"),
               "response_format": (None, {"type": "text"}), "echo": (None, False), "best_of": (None, 1),
               "suffix": (None, ""), "seed": (None,), "functions": (None, []), "function_call": (None, "none"),
               "top_k": (None, -1, 0), "min_p": (None, 0), "repetition_penalty": (None, 1),
               "min_tokens": (None, 0), "ignore_eos": (None, False)}
"""Request fields the backends do not honour, and the values that ask nothing of them: OpenAI's
(``seed``: serve's samples are not seeded per request; ``functions`` / ``function_call``, the
older form of ``tools``) and vLLM's sampling extensions that its own server takes in the body."""

SERVED = frozenset({"model", "max_tokens", "n", "temperature", "top_p", "stop", "stream", "stream_options", "user",
                    "store", "metadata", "service_tier", "parallel_tool_calls", "safety_identifier",
                    "prompt_cache_key"})
"""Request fields served by both routes: the sampling fields :meth:`OpenAIRouter._sampling` reads, and
OpenAI's fields that ask nothing of the sampler; the chat route also serves :data:`CHAT_ONLY`, the
completions route :data:`COMPLETIONS_ONLY` (:func:`served_fields`). Any other field (vLLM's
``guided_choice``, ``stop_token_ids``, ``include_stop_str_in_output``, ``use_beam_search``, ...; the
other route's ``messages``, ``prompt`` or ``max_completion_tokens``), whatever its value, is a 400
naming it, as a field of :data:`UNSUPPORTED` set to other than its default is."""

CHAT_ONLY = frozenset({"messages", "max_completion_tokens"})
COMPLETIONS_ONLY = frozenset({"prompt"})


def served_fields(chat: bool) -> frozenset[str]:
    """The fields a route serves: :data:`SERVED` and its own (chat: ``messages`` and
    ``max_completion_tokens``, which OpenAI's completions route does not have; completions: ``prompt``)."""
    return SERVED | (CHAT_ONLY if chat else COMPLETIONS_ONLY)


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def request_error(body, chat: bool) -> str | None:
    """Why a request body is malformed, as OpenAI answers it (a 400 naming the field), else None: the
    route's required field missing or of the wrong type, a length or ``n`` under 1, ``temperature``
    under 0 (vLLM's bound), ``top_p`` outside (0, 1], ``stop`` not a string or a list of strings. A null field
    is its default. Before this, such a body reached the backends and the request got a bare 500, which
    the openai client sends twice more before raising ``InternalServerError``."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "'messages' is required: a non-empty list of messages"
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                return f"'messages.{i}' must be an object with a 'role'"
            content = message.get("content")
            if isinstance(content, list):
                if not all(isinstance(part, dict) and (part.get("type") != "text" or isinstance(part.get("text"), str))
                           for part in content):
                    return f"'messages.{i}.content' parts must be objects ({{'type': 'text', 'text': ...}})"
            elif not isinstance(content, str):
                return f"'messages.{i}.content' must be a string or a list of content parts"
    elif not isinstance(body.get("prompt"), str | list) or body.get("prompt") == []:
        return "'prompt' is required: a string or a non-empty list of strings"
    for key in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"'{key}' must be an integer of at least 1, not {value!r}"
    temperature, top_p = body.get("temperature"), body.get("top_p")
    if temperature is not None and (not _number(temperature) or temperature < 0):
        return f"'temperature' must be a number of at least 0, not {temperature!r}"
    if top_p is not None and (not _number(top_p) or not 0 < top_p <= 1):
        return f"'top_p' must be a number in (0, 1], not {top_p!r}"
    stop = body.get("stop")
    if stop is not None and not isinstance(stop, str) and not (
            isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        return f"'stop' must be a string or a list of strings, not {stop!r}"
    return None
