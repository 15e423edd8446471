"""``stop`` and the request fields ``graftpool serve`` does not honour: the openai client against
a real Ray Serve app on 127.0.0.1.

The routes read ``model``, the prompt or messages, the length, ``n``, ``temperature`` and
``top_p`` and silently ignored the rest: a request with ``stop=[...]`` got the text past its stop
strings with ``finish_reason`` ``length``, and one with ``presence_penalty``, ``logprobs`` or
``tools`` an answer that had honoured none of them, from an endpoint operations.md says any
OpenAI client works with (issue #51's twenty-ninth read). Now a text is cut before its first stop
string (``finish_reason`` ``stop``, the tokens counted up to it), and a field the backends do not
honour is a 400 naming it."""

from __future__ import annotations

import pytest

from tests.served_llama32 import served_client


def test_stop_strings_cut_the_answer_and_an_unsupported_field_is_refused(tmp_path, ray_local):
    from openai import BadRequestError

    with served_client(tmp_path) as client:
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
