"""A base model's chat turn ends where its template says: Llama-3.2-3B's and Qwen2.5-3B's base
folders name only ``<|end_of_text|>`` / ``<|endoftext|>`` as EOS (tokenizer and generation
config), while their chat templates, which ``models[].chat_template: auto`` renders the prompt
with, close a turn with ``<|eot_id|>`` / ``<|im_end|>``. That token stops a response too
(``workers.rollout.chat.turn_end_id``); with ``chat_template: none`` it is an ordinary token.

The model here is a tiny random Llama whose final norm is zero: every logit is 0, so greedy
sampling picks id 0, which this tokenizer gives ``<|eot_id|>``: the response is one token long
and finished where the turn end stops it, ``max_new_tokens`` long and unfinished where it does
not. Real tokenizer trained here, real model, the ``hf`` backend (vLLM's:
``tests/test_scale_backends.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import GenerationConfig

from tests.llama3_style import (
    END_OF_TEXT,
    EOS,
    TURN_END_FIRST,
    build_llama32_base,
    llama3_tokenizer,
)
from workers.rollout.chat import stop_token_ids, turn_end_id
from workers.rollout.generation import HFGeneration, SamplingParams

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def llama32_base(tmp_path_factory) -> Path:
    return build_llama32_base(tmp_path_factory.mktemp("llama32-base"), emits_turn_end=True)


def test_the_templates_turn_end_stops_a_response_under_chat_template_auto():
    tokenizer = llama3_tokenizer(eos=END_OF_TEXT)
    config = GenerationConfig(eos_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT))
    eot, end = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    assert turn_end_id(tokenizer) == eot
    assert stop_token_ids(tokenizer, config, "auto") == [end, eot]
    assert stop_token_ids(tokenizer, config, "none") == [end]  # no template, no turn to end
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHATML  # Qwen2.5 base: EOS <|endoftext|>, ChatML's <|im_end|> ends a turn
    assert turn_end_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # plain text ends it
    assert turn_end_id(tokenizer) is None
    assert stop_token_ids(tokenizer, config, "auto") == [end]


def test_a_base_models_response_ends_at_its_turn_end_on_the_hf_backend(llama32_base):
    params = SamplingParams(n=2, max_new_tokens=6, temperature=0.0)
    eot = llama3_tokenizer(TURN_END_FIRST, eos=END_OF_TEXT).convert_tokens_to_ids(EOS)
    chat = HFGeneration(str(llama32_base), chat_template="auto").generate(["12+35="], params)[0]
    assert chat.token_ids == [[eot], [eot]] and chat.finished == [True, True]
    plain = HFGeneration(str(llama32_base), chat_template="none").generate(["12+35="], params)[0]
    assert plain.token_ids == [[eot] * 6] * 2 and plain.finished == [False, False]


def test_models_md_says_where_a_response_stops_as_stop_token_ids_does():
    """``docs/models.md``'s stop-token bullet, what a user of base models reads, names every
    source :func:`stop_token_ids` takes: EOS, the generation config's ids, and the chat
    template's turn end (which the template's base models do not name as EOS)."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "models.md").read_text()
    bullet = text[text.index("- **Stop tokens**"):]
    bullet = " ".join(bullet[:bullet.index("\n- **", 1)].split())
    for source in ("EOS", "eos_token_id", "closes an assistant turn", "graftpool serve"):
        assert source in bullet, f"docs/models.md's stop tokens leave out {source!r}: {bullet}"
