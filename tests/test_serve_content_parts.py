"""A chat request as the openai client's typed form sends it: ``graftpool serve`` against the
openai client, a real Ray Serve app on 127.0.0.1.

The chat route gave each message's ``content`` to the chat template as it came. The openai client
(and the tools built on it) may send a content as parts, ``[{"type": "text", "text": ...}]``: a
Llama 3 template rendered the list as its Python repr, so the model answered a prompt the user
never wrote, with status 200 (Qwen2.5's template failed with a 500). And ``temperature=None`` /
``top_p=None``, sent as ``null``, which OpenAI takes as its default, was a 500 (``float(None)``)
(issue #51's thirty-first read). Now text parts are joined into the string a plain content is, a
part that is not text is a 400 naming its type, and a null sampling field is its default."""

from __future__ import annotations

import pytest

from tests.served_llama32 import served_client


def test_text_parts_are_served_as_the_plain_content_and_null_sampling_fields_as_defaults(tmp_path, ray_local):
    from openai import BadRequestError

    with served_client(tmp_path) as client:
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


def test_a_prompt_of_token_ids_is_a_400_not_a_500(tmp_path, ray_local):
    """The completions route took ``prompt=[[1, 2, 3]]`` or ``[1, 2, 3]`` (token ids, which OpenAI
    and vLLM take) into a text backend and answered 500; now a 400 says it takes text."""
    from openai import BadRequestError

    with served_client(tmp_path) as client:
        with pytest.raises(BadRequestError, match="token ids"):
            client.completions.create(model="llama32", prompt=[1, 2, 3], max_tokens=4)
        assert client.completions.create(model="llama32", prompt=["12+35="], max_tokens=4).choices[0].text is not None
