"""A receiver's token rows: the token columns (:data:`TOKENS`) every micro-batch is made of, and the
re-tokenisation of a peer's response string into them.

The receiver re-tokenises every response string it trains on that it did not sample
itself (docs/algorithm.md section 2, "Re-tokenisation") with its own tokenizer; its own responses keep the
token ids its generation backend produced.
"""

from __future__ import annotations

from collections.abc import Sequence

from graftpool.step_record import StepRecord

TOKENS = ("prompt_ids", "response_ids")
"""The columns every micro-batch is made of: a row's prompt ids (the receiver's rendering) and its
response ids (its own tokens, or its re-tokenisation of a peer's string)."""


def token_rows(prompt_ids: Sequence[list[int]], response_ids: Sequence[list[int]]) -> StepRecord:
    """A record of prompt + response token rows (:data:`TOKENS`), e.g. for scoring."""
    return StepRecord({"prompt_ids": [list(p) for p in prompt_ids], "response_ids": [list(r) for r in response_ids]})


def retokenize(tokenizer, response: str, finished: bool) -> list[int]:
    """o^B: the receiver's tokens for a peer response string, plus its EOS if the peer's ended.

    **[choice]** a response that the source ended with its EOS keeps an EOS in the
    receiver's tokenisation, so the receiver also learns where to stop. The string is encoded
    as literal text (``split_special_tokens``): a peer response that contains, say, the
    characters ``<|im_end|>`` never becomes the receiver's end-of-turn control token.
    """
    ids = tokenizer(response, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids + [tokenizer.eos_token_id] if finished else ids


def round_trips(tokenizer, response: str, ids: list[int], finished: bool) -> bool:
    """Whether the receiver's re-tokenisation decodes back to the peer's string exactly. It does
    not when the receiver's vocabulary cannot spell a character (a zoo char tokenizer maps it to
    ``<unk>``): the row is still scored and gated as tokenised, the gate's s reflects the
    ``<unk>``, and ``gate/lossy_retokenized`` counts such responses."""
    body = ids[:-1] if finished and ids and ids[-1] == tokenizer.eos_token_id else ids
    return tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False) == response
