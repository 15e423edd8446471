"""A chat template's date line is the same in every render of a run (``workers/rollout/chat.py``,
``TEMPLATE_VARIABLES``).

Llama 3.x's chat templates write a date into the system turn: ``date_string`` where the caller
gives one, else ``strftime_now("%d %b %Y")``, the clock's. The replica renders a prompt to sample
it, the trainer again to score pi_old and again to train, ``graftpool serve`` again to answer; by
the clock, a step that straddles midnight would score and train one prompt under two dates (its
ratios off 1) and a resume on a later day would continue under other tokens. The template here is
Meta's date block with the clock read to the microsecond, so that two renders by the clock differ
within a test instead of once a day; its fallback date is Meta's."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from tests.llama3_style import build_llama3_style, llama3_tokenizer

DATED_TEMPLATE = (
    "{%- if not date_string is defined %}{%- if strftime_now is defined %}"
    "{%- set date_string = strftime_now('%d %b %Y %H:%M:%S.%f') %}"
    "{%- else %}{%- set date_string = '26 Jul 2024' %}{%- endif %}{%- endif %}"
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nToday Date: {{ date_string }}<|eot_id|>"
    "{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
PROMPT = "13+29= Answer in \\boxed{}."


def test_every_render_of_a_prompt_is_the_same_text_whatever_the_clock():
    from workers.rollout.chat import TEMPLATE_VARIABLES, prompt_ids, render_prompt

    tokenizer = llama3_tokenizer()
    tokenizer.chat_template = DATED_TEMPLATE
    renders = [render_prompt(tokenizer, PROMPT, "auto") for _ in range(3)]
    assert renders[0] == renders[1] == renders[2], "sampled, scored and trained under one date line"
    assert f"Today Date: {TEMPLATE_VARIABLES['date_string']}" in renders[0]
    assert prompt_ids(tokenizer, PROMPT, "auto") == prompt_ids(tokenizer, PROMPT, "auto")


def test_a_served_chat_has_the_date_line_training_had(tmp_path: Path):
    from orchestrator.serving.serve import ModelServer
    from workers.rollout.chat import prompt_ids

    folder = build_llama3_style(tmp_path / "llama32")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = DATED_TEMPLATE
    tokenizer.save_pretrained(folder)
    trained = prompt_ids(tokenizer, PROMPT, "auto")

    server = ModelServer.func_or_class("llama32", str(folder), "auto")  # as a Serve replica builds it
    served = server.render([{"role": "user", "content": PROMPT}])
    assert tokenizer(served, add_special_tokens=False)["input_ids"] == trained
