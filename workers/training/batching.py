"""Token batches for the trainer: one row per response, prompt + response, right padded, made
once per micro-batch from the rows' token columns (:data:`TOKENS`).

The receiver re-tokenises every response string it trains on that it did not sample
itself (docs/algorithm.md section 2, "Re-tokenisation") with its own tokenizer; its own responses keep the
token ids its generation backend produced.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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


def pad_rows(rows: StepRecord, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` and a ``response_mask`` over the targets, from
    the rows' :data:`TOKENS` columns.

    ``response_mask[b, t]`` is 1 where token t+1 of row b is a response token, so it lines
    up with log-probs computed from logits[:, :-1] against input_ids[:, 1:].
    """
    prompts, responses = rows["prompt_ids"], rows["response_ids"]
    lengths = [len(p) + len(r) for p, r in zip(prompts, responses, strict=True)]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    response_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for b, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        seq = list(prompt) + list(response)
        input_ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        start = len(prompt) - 1
        response_mask[b, start : start + len(response)] = 1.0
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask}


def to_device(batch: dict[str, torch.Tensor], device: torch.device | str) -> dict[str, torch.Tensor]:
    return {key: value.to(device) for key, value in batch.items()}


def token_logprobs(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """log pi(x_{t+1} | x_<=t) for every position, [B, T-1] (zero where masked out).

    ``batch`` must already be on the model's device (:func:`to_device`)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    target = batch["input_ids"][:, 1:]
    return logp.gather(-1, target[..., None])[..., 0] * batch["response_mask"]


def scatter_old_logp(rows: StepRecord, current: torch.Tensor) -> torch.Tensor:
    """pi_old's log-probs, response-aligned [B, R] like ``current`` (``workers.training.logprobs.row_logprobs``):
    each row's ``old_logp`` column over its first ``len(response_ids)`` places; a row without
    them (None: an exactly on-policy update, see ``workers.training.sampling_logprobs``) keeps
    ``current``, the detached log-probs of this very forward. On ``current``'s device."""
    out = current.detach().float().clone()
    for b, (old, response) in enumerate(zip(rows["old_logp"], rows["response_ids"], strict=True)):
        if old is not None:
            out[b, : len(response)] = torch.as_tensor(old).to(out.device)
    return out
