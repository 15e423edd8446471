"""Request fields ``graftpool serve`` does not know: the openai client against a real Ray Serve
app on 127.0.0.1.

The thirtieth read refused the fields it listed (``seed``, ``top_k``, ...) and operations.md said
"vLLM's sampling extensions" were refused; any field not on the list was still ignored without a
word. vLLM's own server takes ``guided_choice`` / ``guided_json`` (constrained decoding),
``stop_token_ids``, ``include_stop_str_in_output``, ``use_beam_search`` in the body, so a request
with ``extra_body={"guided_choice": ["yes", "no"]}`` got an unconstrained answer with status 200
(issue #51's thirty-first read). Now a field serve does not know is a 400 naming it; the fields
that ask nothing of the sampler (``user``, ``metadata``, ``store``) are still served."""

from __future__ import annotations

import pytest

from tests.served_llama32 import served_client


def test_a_field_serve_does_not_know_is_refused_by_name(tmp_path, ray_local):
    from openai import BadRequestError

    with served_client(tmp_path) as client:
        ask = {"model": "llama32", "messages": [{"role": "user", "content": "12+35="}], "max_completion_tokens": 4}
        served = client.chat.completions.create(**ask, user="someone", metadata={"k": "v"}, store=False)
        assert served.choices[0].message.content is not None
        with pytest.raises(BadRequestError, match="guided_choice"):
            client.chat.completions.create(**ask, extra_body={"guided_choice": ["yes", "no"]})
        with pytest.raises(BadRequestError, match="include_stop_str_in_output"):
            client.completions.create(model="llama32", prompt="12+35=", max_tokens=4, stop="3",
                                      extra_body={"include_stop_str_in_output": True})
