"""Token batches for the trainer: one row per response, prompt + response, right padded.

The receiver re-tokenises every response string it trains on that it did not sample
itself (docs/algorithm.md section 2, "Re-tokenisation") with its own tokenizer; its own responses keep the
token ids its generation backend produced.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass

import torch


@dataclass
class TrainRow:
    """One response in the receiver's batch (own or grafted)."""

    prompt_ids: list[int]
    response_ids: list[int]
    _: KW_ONLY
    advantage: float = 0.0
    weight: float = 1.0
    is_peer: bool = False
    is_sgt: bool = False
    group: int = 0
    old_logp: torch.Tensor | None = None  # [len(response_ids)], pre-update weights
    source_mean: float = float("nan")  # a peer row's source-side mean log-likelihood (HACPO)
    slot: int = -1  # index in the step's peer output (HACPO peer rows), -1: none
    prompt_id: str = ""
    update: int = -1  # the optimizer update (index in the step's order) that trained it; -1: none


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


def pad_rows(rows: list[TrainRow], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` and a ``response_mask`` over the targets.

    ``response_mask[b, t]`` is 1 where token t+1 of row b is a response token, so it lines
    up with log-probs computed from logits[:, :-1] against input_ids[:, 1:].
    """
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    width = max(lengths)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    response_mask = torch.zeros((len(rows), width - 1), dtype=torch.float32)
    for b, row in enumerate(rows):
        seq = row.prompt_ids + row.response_ids
        input_ids[b, : len(seq)] = torch.tensor(seq)
        attention[b, : len(seq)] = 1
        start = len(row.prompt_ids) - 1
        response_mask[b, start : start + len(row.response_ids)] = 1.0
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


def scatter_old_logp(rows: list[TrainRow], current: torch.Tensor) -> torch.Tensor:
    """pi_old's log-probs, response-aligned [B, R] like ``current`` (``workers.training.logprobs.row_logprobs``):
    each row's stored old log-probs over its first ``len(response_ids)`` places; a row without
    them (``old_logp`` None: an exactly on-policy update, see ``workers.training.sampling_logprobs``) keeps
    ``current``, the detached log-probs of this very forward. On ``current``'s device."""
    out = current.detach().float().clone()
    for b, row in enumerate(rows):
        if row.old_logp is not None:
            out[b, : len(row.response_ids)] = row.old_logp.to(out.device)
    return out
