"""Token batches for the trainer: one row per response, prompt + response, right padded, made
once per micro-batch from the rows' token columns (``workers.receiver.retokenize.TOKENS``).
"""

from __future__ import annotations

import torch

from graftpool.step_record import StepRecord


def pad_rows(rows: StepRecord, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` and a ``response_mask`` over the targets, from
    the rows' ``TOKENS`` columns (``workers.receiver.retokenize``).

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
