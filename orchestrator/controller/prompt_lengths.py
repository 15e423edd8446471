"""Prompts a model's vLLM engine would refuse, found at start-up rather than at the step that
samples one.

vLLM refuses a prompt of ``max_model_len`` tokens or more (``models[].generation.vllm.max_model_len``:
it needs room for at least one new token), and with it the whole generate call. The step fails,
its retries fail alike, and a resumed run samples the same batch again from its checkpoint, so
one long row of a data file would stop a run at whatever step draws it, days in (an eval set's:
at the first evaluation). Here the driver counts each prompt's tokens as the replica renders it
(``workers.rollout.chat.prompt_ids``) and refuses the data before any actor starts.

Only prompts that might reach the limit are tokenized. A token covers at least one byte of the
text it is made from, except the few a tokenizer adds without text (BOS, EOS, a SentencePiece
prefix), so

    tokens(render(p)) <= bytes(p) + bytes(render("")) + SLACK_TOKENS

(``render("")``: the chat template's own text around a prompt; SLACK_TOKENS covers the added
tokens and a template's date line, whose length varies); a prompt whose bound is below the limit
is not tokenized.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from graftpool.tasks import Problem
from orchestrator.config import ConfigError, ModelConfig
from workers.rollout.chat import prompt_ids, render_prompt

SLACK_TOKENS = 16
"""Tokens a rendering may have beyond its bytes (see the module's bound)."""


def engine_limit(model: ModelConfig) -> int | None:
    """The most prompt tokens the model's vLLM engine takes (``max_model_len`` - 1), or None
    (another backend, or ``max_model_len`` unset: the model's own length)."""
    gen = model.generation
    if gen.backend != "vllm" or gen.vllm.max_model_len is None:
        return None
    return gen.vllm.max_model_len - 1


def too_long(problems: Sequence[Problem], tokenizer, mode: str, most: int) -> list[tuple[str, int]]:
    """``(prompt id, tokens)`` of each prompt rendered into more than ``most`` tokens, longest
    first (``mode``: ``models[].chat_template``)."""
    frame = len(render_prompt(tokenizer, "", mode).encode()) + SLACK_TOKENS
    found = []
    for problem in problems:
        if len(problem.prompt.encode()) + frame <= most:
            continue
        tokens = len(prompt_ids(tokenizer, problem.prompt, mode))
        if tokens > most:
            found.append((problem.prompt_id, tokens))
    return sorted(found, key=lambda item: -item[1])


def check_prompt_lengths(models: Sequence[ModelConfig], tokenizers: Mapping[str, object],
                         sets: Mapping[str, Sequence[Problem]]) -> None:
    """Raise :class:`ConfigError` where a prompt of ``sets`` (``{"data.train": problems, ...}``)
    is too long for a model's vLLM engine (:func:`engine_limit`), naming the set, the model, the
    longest prompts and the field; ``tokenizers``: each model's, by name (``check_models``'s)."""
    for model in models:
        most = engine_limit(model)
        if most is None:
            continue
        tokenizer = tokenizers[model.name]
        for label, problems in sets.items():
            found = too_long(problems, tokenizer, model.chat_template, most)
            if found:
                named = ", ".join(f"{prompt_id} ({tokens:,} tokens)" for prompt_id, tokens in found[:3])
                raise ConfigError(
                    f"{label}: {len(found)} of its prompts are too long for model {model.name}'s vLLM engine "
                    f"(models[].generation.vllm.max_model_len {most + 1:,}: a prompt must leave room for one new "
                    f"token, at most {most:,} tokens as the model renders it): {named}. vLLM refuses such a "
                    "prompt with its whole generate call, so the run would stop at the step that draws it, and "
                    "again on every resume; raise max_model_len or leave those rows out of the data file")
