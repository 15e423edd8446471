"""An independent reference for what the trainer computes, written from docs/algorithm.md alone:
plain Hugging Face forwards one row at a time (no padding, no packing, no shared prompts),
the gate's s (Eq. 7) and the token-level objective (Eq. 10) in a few lines of torch. Tests
compare the trainer and the store against it; nothing here imports ``workers``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def prompt_tokens(tokenizer, prompt: str) -> list[int]:
    """The receiver's prompt tokens (the zoo models have no chat template: the prompt as is)."""
    return tokenizer(prompt)["input_ids"]


def peer_tokens(tokenizer, response: str, finished: bool) -> list[int]:
    """o^B: the receiver's own tokenisation of a peer string, plus its EOS if the peer's ended."""
    ids = tokenizer(response, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    return ids + [tokenizer.eos_token_id] if finished else ids


def token_logprobs(model, prompt_ids: list[int], response_ids: list[int]) -> torch.Tensor:
    """log pi(o_t | q, o_<t) for each response token, from one unpadded forward (with grad)."""
    ids = torch.tensor([prompt_ids + response_ids])
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt_ids):, None])[:, 0]


def mean_logp(model, prompt_ids: list[int], response_ids: list[int]) -> float:
    """l(pi, o | q): the mean token log-likelihood (Eq. 6)."""
    with torch.no_grad():
        return float(token_logprobs(model, prompt_ids, response_ids).mean())


@dataclass
class RefRow:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    weight: float
    old_logp: torch.Tensor  # the RECEIVER's pre-update log-probs of response_ids (Eq. 9)


def update_loss(model, rows: list[RefRow], eps_low: float = 0.2, eps_high: float = 0.28) -> torch.Tensor:
    """Eq. 10 over one minibatch: -(1 / sum_j |o_j|) sum_j w_j sum_t min(rho a_j, clip(rho) a_j),
    rho = exp(log pi_theta - log pi_old^B); the denominator counts every token of the rows given
    (gated-out responses are not given), unweighted."""
    total = torch.zeros(())
    tokens = 0
    for row in rows:
        logp = token_logprobs(model, row.prompt_ids, row.response_ids)
        ratio = torch.exp(logp - row.old_logp)
        surrogate = torch.minimum(ratio * row.advantage,
                                  torch.clamp(ratio, 1 - eps_low, 1 + eps_high) * row.advantage)
        total = total + row.weight * surrogate.sum()
        tokens += len(row.response_ids)
    return -total / tokens


def adamw_step(model, loss: torch.Tensor, optimizer: torch.optim.Optimizer, grad_clip: float) -> None:
    """One optimizer update: backward, clip the global gradient norm, AdamW step."""
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
