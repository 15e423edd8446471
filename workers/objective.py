"""The objective every trainer minimises: GRPO advantages, the GRAFT policy loss, SGT.

Equation numbers are those of arXiv 2609.37868, restated in ../shared/GRAFT_SPEC.md.
Pure torch functions over padded [B, T] tensors; no model, no Ray.
"""

from __future__ import annotations

import torch
from torch import Tensor


def grpo_advantages(rewards: Tensor, eps: float = 1e-6) -> Tensor:
    """Group-normalised advantages (Eq. 1).

        a_i = (r_i - mean(R)) / (std(R) + eps)

    ``rewards`` is [G, n]: G groups of n responses. std is the unbiased (n - 1) estimate,
    as in verl. A zero-variance group (all pass or all fail) gets all advantages 0; a
    group of one response (n = 1) has no variance estimate and also gets 0.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.ndim != 2:
        raise ValueError(f"rewards must be [groups, n], got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        return torch.zeros_like(rewards)
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=True)
    return (rewards - mean) / (std + eps)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    is_peer: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """Negative GRAFT objective, -J(theta) of Eq. 10 (Eq. 2 when every weight is 1).

        rho_{j,t} = exp(logp_{j,t} - old_logp_{j,t})                                (Eq. 3, 9)
        J = (1 / sum_j |o_j|) sum_j w_j sum_t min(rho a_j, clip(rho, 1-eps_low, 1+eps_high) a_j)

    Shapes: ``logp``, ``old_logp``, ``mask`` are [B, T] (mask 1 on response tokens);
    ``advantages`` and ``weights`` are [B] constants (no gradient flows through them). The
    token mean counts masked tokens unweighted, so a response with w = 0 still sits in the
    denominator; the trainer drops gated-out responses from the batch before this call.

    ``is_peer`` ([B] bool, optional) splits the clip statistics into own and peer tokens.
    Returns ``(loss, stats)``; stats hold ``clip_frac`` (fraction of masked tokens whose
    clipped branch is the active one, i.e. whose gradient is zeroed by the clip),
    ``own_clip_frac``, ``peer_clip_frac``, ``ratio_mean`` and ``n_tokens``.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.detach().to(logp.dtype)[:, None]
    w = weights.detach().to(logp.dtype)[:, None]
    # Padding gets log-ratio 0 so that garbage there cannot overflow into inf * 0 = NaN.
    log_ratio = torch.where(mask > 0, logp - old_logp.detach(), torch.zeros_like(logp))
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    surrogate = torch.minimum(unclipped, clipped)
    n_tokens = mask.sum().clamp_min(1.0)
    loss = -(w * surrogate * mask).sum() / n_tokens

    with torch.no_grad():
        clip_active = (clipped < unclipped).to(logp.dtype) * mask
        stats = {
            "clip_frac": float(clip_active.sum() / n_tokens),
            "ratio_mean": float((ratio * mask).sum() / n_tokens),
            "n_tokens": float(mask.sum()),
        }
        if is_peer is not None:
            peer = is_peer.to(torch.bool)[:, None].expand_as(mask)
            for name, rows in (("own", ~peer), ("peer", peer)):
                count = (mask * rows).sum()
                stats[f"{name}_clip_frac"] = (
                    float((clip_active * rows).sum() / count) if count > 0 else 0.0
                )
                stats[f"{name}_tokens"] = float(count)
    return loss, stats


def sgt_loss(logp: Tensor, mask: Tensor, coef: float = 0.1) -> Tensor:
    """SGT baseline term: coef * NLL of the selected correct peer responses.

        L_SGT = coef * (1 / |S|) sum_{o in S} (1 / |o|) sum_t -log pi_theta(o_t | q, o_<t)

    ``logp`` and ``mask`` are [S, T] for the S selected peer responses (one per receiver
    all-fail prompt, drawn uniformly among the peer's correct ones by the ``sgt`` policy).
    **[choice]** each response's NLL is its token mean, so long and short answers weigh
    the same; the paper's lambda = 0.1 is the default ``coef``. Zero when S = 0.
    """
    if logp.shape[0] == 0:
        return logp.sum() * 0.0
    mask = mask.to(logp.dtype)
    per_response = -(logp * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
    return coef * per_response.mean()
