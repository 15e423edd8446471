"""The objective every trainer minimises: GRPO advantages, the GRAFT policy loss, SGT, and
HACPO's sequence-level loss.

Equation numbers are those of arXiv 2609.37868, restated in docs/algorithm.md; "HACPO
Eq." numbers are those of arXiv 2603.02604 (docs/algorithm.md, section 3). Pure torch functions
over padded [B, T] tensors; no model, no Ray. The trainer picks its policy-gradient
objective from :data:`OBJECTIVES` by the name an exchange policy gives
(:class:`graftpool.contracts.ObjectiveSpec`): ``token`` (GRPO / GRAFT, Eq. 10) or
``sequence`` (GSPO / HACPO).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from graftpool.registry import Registry
from workers.registries import (  # declared without torch (the config's choices)
    LOSS_NORMALIZERS,
    PEER_RATIOS,
)


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


PeerSurrogate = Callable[[Tensor, Tensor, Tensor, float, float, float], tuple[Tensor, Tensor]]
"""(logp, old_logp, advantages [B, 1], eps_low, eps_high, gamma) -> the per-token surrogate [B, T]
and where the clip is active [B, T] (bool), for the rows it is applied to."""

register_peer_ratio = PEER_RATIOS.register


def _log_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    # padding gets log-ratio 0 so that garbage there cannot overflow into inf * 0 = NaN
    return torch.where(mask > 0, logp - old_logp.detach(), torch.zeros_like(logp))


@register_peer_ratio("clip")
def clipped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps_low: float, eps_high: float,
                      gamma: float, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eq. 10's term: min(rho a, clip(rho, 1-eps_low, 1+eps_high) a), rho = pi_theta / pi_old (Eqs. 3, 9)."""
    ratio = torch.exp(_log_ratio(logp, old_logp, mask if mask is not None else torch.ones_like(logp)))
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


@register_peer_ratio("shaped")
def shaped_surrogate(logp: Tensor, old_logp: Tensor, adv: Tensor, eps_low: float, eps_high: float,
                     gamma: float, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """LUFFY's policy shaping of off-policy tokens (arXiv 2504.14945, Sec. 3.3): the importance
    ratio of a peer token is replaced by

        f(pi_theta(o_t)) = pi_theta(o_t) / (pi_theta(o_t) + gamma),   gamma = 0.1 in the paper,

    with no clip and no old-policy denominator (LUFFY sets the off-policy model's probability
    to 1). d f / d log pi = gamma pi / (pi + gamma)^2: tokens the receiver finds unlikely still
    get gradient, and a likely token's gradient fades instead of being cut at a clip edge."""
    prob = torch.exp(logp)
    return prob / (prob + gamma) * adv, torch.zeros_like(logp, dtype=torch.bool)


def policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    weights: Tensor,
    mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    is_peer: Tensor | None = None,
    peer_ratio: str = "clip",
    shaping_gamma: float = 0.1,
) -> tuple[Tensor, dict[str, float]]:
    """Negative GRAFT objective, -J(theta) of Eq. 10 (Eq. 2 when every weight is 1).

        rho_{j,t} = exp(logp_{j,t} - old_logp_{j,t})                                (Eq. 3, 9)
        J = (1 / sum_j |o_j|) sum_j w_j sum_t min(rho a_j, clip(rho, 1-eps_low, 1+eps_high) a_j)

    Shapes: ``logp``, ``old_logp``, ``mask`` are [B, T] (mask 1 on response tokens);
    ``advantages`` and ``weights`` are [B] constants (no gradient flows through them). The
    token mean counts masked tokens unweighted, so a response with w = 0 still sits in the
    denominator; the trainer drops gated-out responses from the batch before this call.

    ``is_peer`` ([B] bool, optional) splits the clip statistics into own and peer tokens, and
    selects the rows whose term is ``peer_ratio`` (:data:`PEER_RATIOS`: ``clip``, Eq. 10 as for
    own tokens, the paper; ``shaped``, LUFFY's f(pi) = pi / (pi + ``shaping_gamma``)).
    Returns ``(loss, stats)``; stats hold ``clip_frac`` (fraction of masked tokens whose
    clipped branch is the active one, i.e. whose gradient is zeroed by the clip),
    ``own_clip_frac``, ``peer_clip_frac``, ``ratio_mean`` and ``n_tokens``.
    """
    mask = mask.to(logp.dtype)
    adv = advantages.detach().to(logp.dtype)[:, None]
    w = weights.detach().to(logp.dtype)[:, None]
    surrogate, clip_active = clipped_surrogate(logp, old_logp, adv, eps_low, eps_high, shaping_gamma, mask)
    if is_peer is not None and peer_ratio != "clip" and bool(is_peer.any()):
        peer_rows = is_peer.to(torch.bool)[:, None].expand_as(mask)
        shaped, shaped_clip = PEER_RATIOS.get(peer_ratio)(logp, old_logp, adv, eps_low, eps_high, shaping_gamma,
                                                          mask)
        surrogate = torch.where(peer_rows, shaped, surrogate)
        clip_active = torch.where(peer_rows, shaped_clip, clip_active)
    n_tokens = mask.sum().clamp_min(1.0)
    loss = -(w * surrogate * mask).sum() / n_tokens

    with torch.no_grad():
        ratio = torch.exp(_log_ratio(logp, old_logp, mask))
        clip_active = clip_active.to(logp.dtype) * mask
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


def lower_bound(minibatch: int, lb: float = 0.8, delta_step: float = 0.025) -> float:
    """HACPO's stepwise peer clip floor (HACPO Eq. 13-14): lb_m = min(1, lb_0 + m * delta_step),
    m = the optimizer update's index within the step (0, 1, ...; own-only updates count)."""
    return min(1.0, lb + minibatch * delta_step)


def sequence_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    mask: Tensor,
    advantages: Tensor,
    is_peer: Tensor,
    source_mean: Tensor,
    lower: float = 0.8,
    alpha: float = 1.0,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    denominator: float | None = None,
    max_log_ratio: float = 10.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Negative HACPO objective of one minibatch, -(J_homo + J_hete) (HACPO App. E Eq. 47-53).

    Own response i (GSPO, HACPO Eq. 47-49), against the learner's own pi_old:

        s_i = exp( (1/|y_i|) sum_t [log pi_theta(y_it) - log pi_old(y_it)] )
        J_i = min( s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i )

    Peer response i from source j (HACPO Eq. 11-12, 50-52), y_i re-tokenised for the learner:

        s_i = exp( (1/|y_i^k|) sum_t log pi_theta(y_it^k) - l_i^j ),  l_i^j = the source's
              pre-update mean log-likelihood of its own tokens (``source_mean``)
        J_i = clip(s_i, lb_m, 1) * sg[s_i]^alpha * A_i

    so inside [lb_m, 1] the gradient is s_i^(1+alpha) A_i (1/|y|) sum_t grad log pi_theta, and a
    peer below lb_m or above 1 gets none. ``A`` already carries HACPO's capability coefficient
    (``policies.hacpo``). |log s| is clamped at ``max_log_ratio`` (the official code's 10).

    loss = -(sum_i J_i) / denominator (default: the number of rows, one sequence mean).
    Shapes: ``logp``, ``old_logp``, ``mask`` [B, T]; ``advantages``, ``is_peer``,
    ``source_mean`` [B] (``source_mean`` is read on peer rows only). Returns ``(loss, stats)``:
    per-row ``ratio`` s, ``weight`` (s^(1+alpha) for a peer in range, 0 out of range, 1 own),
    ``clipped`` (own: the clip branch is active; peer: outside [lb_m, 1]).
    """
    mask = mask.to(logp.dtype)
    peer = is_peer.to(torch.bool)
    adv = advantages.detach().to(logp.dtype)
    lengths = mask.sum(dim=1).clamp_min(1.0)
    own_log = torch.where(mask > 0, logp - old_logp.detach(), torch.zeros_like(logp)).sum(dim=1) / lengths
    source = torch.nan_to_num(source_mean.detach().to(logp.dtype), nan=0.0)  # NaN on own rows
    peer_log = (logp * mask).sum(dim=1) / lengths - source
    log_ratio = torch.clamp(torch.where(peer, peer_log, own_log), -max_log_ratio, max_log_ratio)
    ratio = torch.exp(log_ratio)
    own_unclipped = ratio * adv
    own_clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    own_term = torch.minimum(own_unclipped, own_clipped)
    peer_term = torch.clamp(ratio, min=lower, max=1.0) * ratio.detach() ** alpha * adv
    terms = torch.where(peer, peer_term, own_term)
    count = float(denominator) if denominator is not None else float(max(logp.shape[0], 1))
    loss = -terms.sum() / count
    with torch.no_grad():
        in_range = (ratio >= lower) & (ratio <= 1.0)
        weight = torch.where(peer, torch.where(in_range, ratio ** (1.0 + alpha), torch.zeros_like(ratio)),
                             torch.ones_like(ratio))
        clipped = torch.where(peer, ~in_range, own_clipped < own_unclipped)
    return loss, {"ratio": ratio.detach(), "weight": weight, "clipped": clipped}


@dataclass
class RowConstants:
    """What an objective needs of each row besides its log-probs, [B] tensors."""

    advantages: Tensor
    weights: Tensor  # the gate weight w (token objective)
    is_peer: Tensor  # bool
    source_mean: Tensor  # a peer row's source-side mean log-likelihood (NaN: none)


@dataclass
class ObjectiveTerms:
    """One micro-batch's share of a minibatch loss, and its clip counts."""

    loss: Tensor  # already divided by the minibatch's normaliser: micro-batch losses add up
    clip_counts: Tensor  # float64 [own clipped, own units, peer clipped, peer units]
    ratio: Tensor  # [B] detached: the row's mean token ratio (token) or s (sequence)
    weight: Tensor  # [B] detached: the row's effective weight in this update


@dataclass(frozen=True)
class StepTokens:
    """What a normaliser may look at beyond its own minibatch: the step's RL tokens (own and
    peer rows, every minibatch of the epoch) and the number of minibatches they are cut into."""

    tokens: int
    minibatches: int


LossNormalizer = Callable[[int, StepTokens], float]
"""(the minibatch's token count, the step's) -> the token-mean's denominator for that minibatch."""

register_loss_normalizer = LOSS_NORMALIZERS.register


@register_loss_normalizer("minibatch")
def minibatch_tokens(minibatch: int, step: StepTokens) -> float:
    """The paper's Eq. 10 per minibatch: 1 / sum_j |o_j| over the minibatch's own rows."""
    return float(max(minibatch, 1))


@register_loss_normalizer("step")
def step_tokens(minibatch: int, step: StepTokens) -> float:
    """A step-wide token mean (Dr. GRPO's constant normaliser; verl's global token mean): every
    minibatch divides by the step's mean minibatch token count, sum_step |o| / K, so a token
    weighs the same in every update of the step, whatever its minibatch holds. Equals
    ``minibatch`` when the K minibatches hold equal token counts; a small peer-only minibatch
    no longer gets several times the per-token weight of an own one."""
    return float(max(step.tokens, 1)) / max(step.minibatches, 1)


class Objective:
    """A registered policy-gradient objective: ``normaliser`` of a whole minibatch (its
    loss's denominator, so that micro-batches and data-parallel ranks add up), and the loss
    of a micro-batch of it."""

    def normaliser(self, lengths: Sequence[int], prompt_ids: Sequence[str],
                   step: StepTokens | None = None) -> float:  # pragma: no cover
        """``step`` None: the minibatch is the whole step."""
        raise NotImplementedError

    def __call__(self, logp: Tensor, old_logp: Tensor, mask: Tensor, rows: RowConstants,
                 minibatch: int, normaliser: float) -> ObjectiveTerms:  # pragma: no cover
        raise NotImplementedError


OBJECTIVES: Registry[type[Objective]] = Registry("objective", "the exchange policy's objective", in_actors="the trainer ranks")
register_objective = OBJECTIVES.register


@register_objective("token")
@dataclass
class TokenObjective(Objective):
    """GRPO / GRAFT (Eq. 10): :func:`policy_loss`, a token mean whose denominator is the
    registered ``loss_normalizer`` (:data:`LOSS_NORMALIZERS`), peer tokens' term the registered
    ``peer_ratio`` (:data:`PEER_RATIOS`); clip counts are in tokens."""

    eps_low: float = 0.2
    eps_high: float = 0.28
    loss_normalizer: str = "minibatch"
    peer_ratio: str = "clip"
    shaping_gamma: float = 0.1

    def __post_init__(self) -> None:
        LOSS_NORMALIZERS.get(self.loss_normalizer)  # an unknown name fails naming the field
        PEER_RATIOS.get(self.peer_ratio)

    def normaliser(self, lengths: Sequence[int], prompt_ids: Sequence[str], step: StepTokens | None = None) -> float:
        tokens = sum(lengths)
        return LOSS_NORMALIZERS.get(self.loss_normalizer)(tokens, step or StepTokens(tokens, 1))

    def __call__(self, logp, old_logp, mask, rows, minibatch, normaliser) -> ObjectiveTerms:
        loss, stats = policy_loss(logp, old_logp, rows.advantages, rows.weights, mask, self.eps_low,
                                  self.eps_high, is_peer=rows.is_peer, peer_ratio=self.peer_ratio,
                                  shaping_gamma=self.shaping_gamma)
        with torch.no_grad():
            m = mask.to(logp.dtype)
            ratio = (torch.exp(torch.where(m > 0, logp - old_logp, torch.zeros_like(logp))) * m).sum(1) \
                / m.sum(1).clamp_min(1.0)
        counts = torch.tensor([stats["own_clip_frac"] * stats["own_tokens"], stats["own_tokens"],
                               stats["peer_clip_frac"] * stats["peer_tokens"], stats["peer_tokens"]],
                              dtype=torch.float64)
        return ObjectiveTerms(loss * (stats["n_tokens"] / normaliser), counts, ratio, rows.weights.detach())


@register_objective("sequence")
@dataclass
class SequenceObjective(Objective):
    """GSPO for own rows, HACPO's cross ratio for peer rows (:func:`sequence_policy_loss`);
    clip counts are in rows. The parameters are the ``hacpo`` policy's.

    ``normalization``: ``group`` (the paper, HACPO Eq. 53: 1/G on each term, averaged over the
    minibatch's prompts: the denominator is G x its distinct prompts) | ``sequence`` (the
    official code: one mean over the minibatch's rows). They differ when a minibatch holds
    more than G rows of one prompt, e.g. the (N-1) G peer rows of a prompt for N > 2."""

    eps_low: float = 3e-4
    eps_high: float = 4e-4
    alpha: float = 1.0
    lb: float = 0.8
    delta_step: float = 0.025
    normalization: str = "group"
    group_size: int = 8
    max_log_ratio: float = 10.0

    def __post_init__(self) -> None:
        if self.normalization not in ("group", "sequence"):
            raise ValueError(f"exchange.params.normalization: expected 'group' or 'sequence', "
                             f"got {self.normalization!r}")

    def normaliser(self, lengths: Sequence[int], prompt_ids: Sequence[str], step: StepTokens | None = None) -> float:
        if self.normalization == "sequence":
            return float(max(len(lengths), 1))
        return float(max(self.group_size * len(set(prompt_ids)), 1))

    def __call__(self, logp, old_logp, mask, rows, minibatch, normaliser) -> ObjectiveTerms:
        loss, stats = sequence_policy_loss(
            logp, old_logp, mask, rows.advantages, rows.is_peer, rows.source_mean,
            lower_bound(minibatch, self.lb, self.delta_step), self.alpha, self.eps_low, self.eps_high,
            normaliser, self.max_log_ratio)
        peer = rows.is_peer.to(torch.bool).cpu()
        clipped = stats["clipped"].cpu()
        counts = torch.tensor([float((clipped & ~peer).sum()), float((~peer).sum()),
                               float((clipped & peer).sum()), float(peer.sum())], dtype=torch.float64)
        return ObjectiveTerms(loss, counts, stats["ratio"], stats["weight"])


def make_objective(name: str, params: dict) -> Objective:
    """The registered objective ``name`` built with ``params``; unknown ones name what is expected."""
    return OBJECTIVES.get(name)(**params)
