"""A receiver's token rows: the token columns (:data:`TOKENS`) every micro-batch is made of, and the
re-tokenisation of a peer's response string into them.

The receiver re-tokenises every response string it trains on that it did not sample
itself (docs/algorithm.md section 2, "Re-tokenisation") with its own tokenizer; its own responses keep the
token ids its generation backend produced.
"""

from __future__ import annotations

from collections.abc import Sequence

from graftpool.step_record import StepRecord
from workers.rollout.chat import turn_end_id, uses_template

TOKENS = ("prompt_ids", "response_ids")
"""The columns every micro-batch is made of: a row's prompt ids (the receiver's rendering) and its
response ids (its own tokens, or its re-tokenisation of a peer's string)."""


def token_rows(prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]]) -> StepRecord:
    """A record of prompt + response token rows (:data:`TOKENS`), e.g. for scoring."""
    return StepRecord({"prompt_ids": [list(p) for p in prompt_ids], "response_ids": [list(r) for r in response_ids]})


def response_end_id(tokenizer, chat_template: str) -> int:
    """The token the receiver's own finished responses end with, which :func:`retokenize` gives a
    finished peer response: where the receiver renders its prompts with its chat template
    (``models[].chat_template``, ``workers.rollout.chat.uses_template``), the token that template
    closes an assistant turn with (``<|im_end|>``, ``<|eot_id|>``: ``turn_end_id``), which a base
    model's EOS (``<|endoftext|>``, ``<|end_of_text|>``) is not; else (no template, or one that
    closes a turn with no special token) its EOS."""
    end = turn_end_id(tokenizer) if uses_template(tokenizer, chat_template) else None
    return tokenizer.eos_token_id if end is None else end


def retokenize(tokenizer, response: str, finished: bool, end_id: int | None = None) -> list[int]:
    """o^B: the receiver's tokens for a peer response string, plus ``end_id`` if the peer's ended
    (the receiver's :func:`response_end_id`; None: its EOS, for a receiver without a chat template).

    **[choice]** a response that the source ended keeps an end in the receiver's tokenisation,
    the token the receiver's own responses end with, so the receiver also learns where to stop
    as it stops. The string is encoded as literal text (``split_special_tokens``): a peer
    response that contains, say, the characters ``<|im_end|>`` never becomes the receiver's
    end-of-turn control token.
    """
    ids = tokenizer(response, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    end = tokenizer.eos_token_id if end_id is None else end_id
    return ids + [end] if finished else ids


def over_budget(prompt_ids: Sequence[int], response_ids: Sequence[int], max_tokens: int | None) -> bool:
    """Whether a peer response's row in the receiver's tokens (its prompt ids + its re-tokenisation)
    is longer than ``models[].trainer.max_tokens_per_micro_batch`` (None: no budget, never).

    The receiver's own rows are bounded by its generation (``max_new_tokens``, vLLM's
    ``max_model_len``); a peer's re-tokenisation is not: a response the donor wrote in 4,096 tokens
    can take three times as many in the receiver's (Llama 3's byte-level BPE writes up to three
    digits a token, Qwen2.5's one). Such a row is neither scored nor trained (a forward of it would
    hold whole-vocabulary logits for all its tokens, past what the budget says a rank holds): the
    gate gives it s NaN and w 0, and ``gate/over_budget`` counts it."""
    return max_tokens is not None and len(prompt_ids) + len(response_ids) > max_tokens


def budgeted_rows(rows: Sequence[tuple[list[int], list[int]]], max_tokens: int | None) -> tuple[StepRecord, list[bool]]:
    """Token rows to score for peer responses (``rows``: each one's prompt ids and re-tokenisation),
    and which are past the budget (:func:`over_budget`): such a row keeps one response token, so
    that every rank still runs the same forwards, and its caller answers NaN for it."""
    past = [over_budget(p, r, max_tokens) for p, r in rows]
    return token_rows([p for p, _ in rows], [r[:1] if x else r for (_, r), x in zip(rows, past, strict=True)]), past


def round_trips(tokenizer, response: str, ids: list[int], finished: bool) -> bool:
    """Whether the receiver's re-tokenisation (:func:`retokenize`'s ``ids``, their last the end
    it appended where ``finished``) decodes back to the peer's string exactly. It does
    not when the receiver's vocabulary cannot spell a character (a zoo char tokenizer maps it to
    ``<unk>``): the row is still scored and gated as tokenised, the gate's s reflects the
    ``<unk>``, and ``gate/lossy_retokenized`` counts such responses."""
    body = ids[:-1] if finished and ids else ids
    return tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False) == response
