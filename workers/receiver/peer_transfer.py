"""How a receiver takes in a donor group: the paper's GRAFT and its ablations (issue #13).

GRAFT (docs/algorithm.md section 2): the WHOLE donor group is offered; the gate (Eqs. 7-8) admits
each response on its own s; an admitted response keeps the donor's advantage a_i^A,
never re-normalised. Each step of that is an ``algorithm`` field with the paper's method
as default:

- ``peer_responses``: ``all`` (paper) | ``success`` (the paper's success-only ablation:
  only the donor's correct responses, r_i = 1, are offered);
- ``gate_kind`` (a registry, ``workers.receiver.gate_kinds``): what s is computed on,
  ``token_mean`` (paper, Eq. 7) | ``per_byte`` | ``answer_masked`` | ``self_calibrated``;
- ``gate_scope``: ``response`` (paper, Eq. 8 per response) | ``group`` (beyond the paper:
  the offered responses are admitted or dropped together on their mean s, with
  w = 1[mean s > delta] * min(mean s, 1), so the admitted set keeps the donor group's
  zero-sum advantages);
- ``peer_advantages`` (a registry, one function each): ``donor`` (paper) | ``pooled`` (the
  paper's ablation) | ``recentered`` (beyond the paper) | ``asymmetric`` (beyond the paper:
  negative peer advantages scaled by ``exchange.peer_beta``, after Asymmetric REINFORCE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike

from graftpool.contracts import SUCCESS_THRESHOLD
from graftpool.registry import Registry
from workers.receiver.gate_kinds import GATE_KINDS, GateInputs


def gate_weights(scores: ArrayLike, delta: float = 0.8) -> np.ndarray:
    """Eq. 8: w = 1[s > delta] * min(s, 1). Zero exactly where s <= delta."""
    scores = np.asarray(scores, dtype=float)
    return np.where(scores > delta, np.minimum(scores, 1.0), 0.0)


@dataclass(frozen=True)
class PeerAdvantageParams:
    """The options a peer-advantage estimator may read (each reads only its own)."""

    beta: float = 0.5  # ``asymmetric``: the scale of negative peer advantages, in [0, 1]


PeerAdvantage = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, PeerAdvantageParams], np.ndarray]
"""(donor rewards [n], donor advantages [n], receiver rewards [n'], admitted [n] bool, params)
-> the advantage each donor response is trained with [n] (ignored where not admitted)."""

PEER_ADVANTAGES: Registry[PeerAdvantage] = Registry("peer advantage", "exchange.peer_advantages", in_actors="the trainer ranks")
register_peer_advantage = PEER_ADVANTAGES.register

EPS = 1e-6  # as in Eq. 1


@register_peer_advantage("donor")
def donor_advantages(donor_rewards, donor_adv, receiver_rewards, admitted, params=PeerAdvantageParams()) -> np.ndarray:
    """The paper: a_i^A, computed on the donor's full group (Eq. 1), kept as is."""
    return np.asarray(donor_adv, dtype=float).copy()


@register_peer_advantage("pooled")
def pooled_advantages(donor_rewards, donor_adv, receiver_rewards, admitted, params=PeerAdvantageParams()) -> np.ndarray:
    """The paper's pooled ablation: Eq. 1 over the receiver's failed group and the donor
    group together, R = [r^B, r^A] (2n rewards):

        a_i = (r_i^A - mean(R)) / (std(R) + eps),   std unbiased, as in Eq. 1
    """
    pooled = np.concatenate([np.asarray(receiver_rewards, float), np.asarray(donor_rewards, float)])
    if pooled.size < 2 or pooled.std(ddof=1) == 0:
        return np.zeros(len(donor_rewards))
    return (np.asarray(donor_rewards, float) - pooled.mean()) / (pooled.std(ddof=1) + EPS)


@register_peer_advantage("recentered")
def recentered_advantages(donor_rewards, donor_adv, receiver_rewards, admitted, params=PeerAdvantageParams()) -> np.ndarray:
    """Beyond the paper: the admitted responses' donor advantages re-normalised over the
    admitted subset S, so that they sum to zero again:

        a'_i = (a_i - mean_S(a)) / (std_S(a) + eps)   for i in S,   0 elsewhere

    (std unbiased; fewer than 2 admitted, or all alike: 0)."""
    adv = np.asarray(donor_adv, dtype=float)
    mask = np.asarray(admitted, dtype=bool)
    out = np.zeros_like(adv)
    if mask.sum() < 2 or adv[mask].std(ddof=1) == 0:
        return out
    out[mask] = (adv[mask] - adv[mask].mean()) / (adv[mask].std(ddof=1) + EPS)
    return out


@register_peer_advantage("asymmetric")
def asymmetric_advantages(donor_rewards, donor_adv, receiver_rewards, admitted,
                          params=PeerAdvantageParams()) -> np.ndarray:
    """Beyond the paper: the donor's advantages with the negative ones scaled by beta in [0, 1],

        a'_i = a_i            if a_i >= 0
        a'_i = beta * a_i     if a_i < 0

    Asymmetric REINFORCE (Arnal et al., arXiv 2506.20520) shows that off-policy policy
    gradients must lean on positive rewards: with the baseline below the behaviour policy's
    mean reward, learning is stable, above it the policy collapses. Peer responses are
    off-policy for the receiver, and the gate admits more of a donor's wrong answers than its
    right ones (a receiver that fails a prompt finds the right answers least likely), so the
    admitted set's push is net-negative; beta < 1 tilts it back. beta = 1 is ``donor``,
    beta = 0 keeps only the correct responses' push (success-only, but through the gate)."""
    adv = np.asarray(donor_adv, dtype=float)
    return np.where(adv < 0, params.beta * adv, adv)


PeerResponses = Literal["all", "success"]
GateScope = Literal["response", "group"]
PEER_RESPONSES: tuple[str, ...] = get_args(PeerResponses)
GATE_SCOPES: tuple[str, ...] = get_args(GateScope)


def offered_responses(mode: str, donor_rewards: np.ndarray) -> np.ndarray:
    """``exchange.peer_responses``: which donor responses are offered to the gate, [n] bool."""
    rewards = np.asarray(donor_rewards, dtype=float)
    if mode == "all":
        return np.ones(len(rewards), dtype=bool)
    if mode == "success":
        return rewards > SUCCESS_THRESHOLD
    raise ValueError(f"exchange.peer_responses: expected one of {list(PEER_RESPONSES)}, got {mode!r}")


def gate(scores: np.ndarray, delta: float, scope: str, offered: np.ndarray) -> np.ndarray:
    """w of each donor response (0 where not offered), by ``exchange.gate_scope``:
    ``response``: Eq. 8 per response; ``group``: Eq. 8 on the mean s of the offered
    responses (finite ones), the same w for all of them."""
    scores = np.asarray(scores, dtype=float)
    offered = np.asarray(offered, dtype=bool)
    if scope == "response":
        w = gate_weights(scores, delta)
    elif scope == "group":
        finite = offered & np.isfinite(scores)
        mean = scores[finite].mean() if finite.any() else -np.inf
        w = np.full(len(scores), float(gate_weights(np.array([mean]), delta)[0]))
    else:
        raise ValueError(f"exchange.gate_scope: expected one of {list(GATE_SCOPES)}, got {scope!r}")
    return np.where(offered, w, 0.0)


@dataclass(frozen=True)
class PeerTransfer:
    """A receiver's admission of one donor group: which responses are offered, their gate
    weights w (Eqs. 7-8) and the advantages they are trained with."""

    delta: float = 0.8
    gate: bool = True  # False: the no-gate ablation, w = 1 for every offered response
    peer_responses: str = "all"
    gate_scope: str = "response"
    peer_advantages: str = "donor"
    peer_beta: float = 0.5  # ``asymmetric`` peer advantages: the scale of negative ones
    gate_kind: str = "token_mean"  # what s is computed on (workers.receiver.gate_kinds)

    def __post_init__(self) -> None:
        if not 0.0 <= self.peer_beta <= 1.0:
            raise ValueError(f"exchange.peer_beta: expected a value in [0, 1], got {self.peer_beta!r}")
        if self.peer_responses not in PEER_RESPONSES:
            raise ValueError(f"exchange.peer_responses: expected one of {list(PEER_RESPONSES)}, "
                             f"got {self.peer_responses!r}")
        if self.gate_scope not in GATE_SCOPES:
            raise ValueError(f"exchange.gate_scope: expected one of {list(GATE_SCOPES)}, got {self.gate_scope!r}")
        PEER_ADVANTAGES.get(self.peer_advantages)  # names the field when unknown
        GATE_KINDS.get(self.gate_kind)

    def admit(self, scored: GateInputs, donor_rewards: np.ndarray, donor_adv: np.ndarray,
              receiver_rewards: np.ndarray) -> Admission:
        """``scored``: what the gate kind reads; its ``receiver_mean`` is l(pi_old^B, o^B | q) of
        each re-tokenised response (-inf: it re-tokenised to nothing, and carries no tokens; NaN: not
        scored, its row past the receiver's token budget): w 0 for either."""
        receiver_mean = np.asarray(scored.receiver_mean, dtype=float)
        s = np.asarray(GATE_KINDS.get(self.gate_kind).score(scored), dtype=float)
        offered = offered_responses(self.peer_responses, donor_rewards)
        w = gate(s, self.delta, self.gate_scope, offered) if self.gate else offered.astype(float)
        w[~np.isfinite(receiver_mean)] = 0.0  # re-tokenised to nothing, or not scored (past the token budget)
        advantages = PEER_ADVANTAGES.get(self.peer_advantages)(donor_rewards, donor_adv, receiver_rewards, w > 0,
                                                               PeerAdvantageParams(self.peer_beta))
        return Admission(s, w, np.asarray(advantages, dtype=float), offered)


@dataclass(frozen=True)
class Admission:
    """One donor group as a receiver takes it in, each field [n]."""

    s: np.ndarray  # compatibility: Eq. 7, or the gate kind's s
    w: np.ndarray  # gate weight, Eq. 8 (0: not admitted)
    advantages: np.ndarray  # what each admitted response is trained with
    offered: np.ndarray  # bool: offered to the gate (peer_responses)
