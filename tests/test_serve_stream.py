"""A streamed request to ``graftpool serve``: the openai client with ``stream=True``, a real Ray
Serve app on 127.0.0.1.

The routes ignored ``stream`` and answered JSON; the openai client reads a streamed answer as
server-sent events only, so every ``stream=True`` call (what chat front-ends and most client
code send) got an empty stream: no text, no error, from an endpoint operations.md says any OpenAI
client works with (issue #51's twenty-ninth read). Now a streamed request gets the answer as
events, the same text as the unstreamed request's."""

from __future__ import annotations

from tests.served_llama32 import served_client


def test_a_streamed_request_gets_the_answer_as_events(tmp_path, ray_local):
    with served_client(tmp_path) as client:
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
