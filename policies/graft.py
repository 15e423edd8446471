"""GRAFT for a pair of models (docs/algorithm.md section 2): candidates and the balanced exchange
(routed by ``pair`` and ``pool``, policies/pool.py), and the ``graft`` transfer (the donor's whole group replaces the
receiver's all-fail group, trained with the donor's advantages through the gate).

The gate (Eqs. 6-8) and the receiver-side options (``exchange.delta``, ``peer_*``...) are
receiver-side math: ``workers/receiver/peer_transfer.py``, ``workers/receiver/kinds/graft.py``.

Pure NumPy over per-prompt success counts k (number of rewarded responses out of n).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from graftpool.contracts import ExchangeInput, Route
from policies.routing import Triple
from policies.transfer import Transfer, register_transfer


def candidates(k_source: ArrayLike, k_receiver: ArrayLike, n: int) -> np.ndarray:
    """Eq. 4: C_{S->R} = { q : k_R(q) = 0 and 1 <= k_S(q) < n }.

    The receiver failed every rollout on q and the source group has a success AND a
    failure (so its advantages are not all zero). Returns a bool array over prompts.
    """
    k_source = np.asarray(k_source)
    k_receiver = np.asarray(k_receiver)
    if k_source.shape != k_receiver.shape:
        raise ValueError(f"k_source {k_source.shape} and k_receiver {k_receiver.shape} differ")
    return (k_receiver == 0) & (k_source >= 1) & (k_source < n)


def top_m_with_ties(is_candidate: np.ndarray, score: np.ndarray, m: int) -> np.ndarray:
    """Keep the m highest-scoring candidates plus every candidate tied with the m-th.

    This is GRAFT's balanced-exchange ranking rule; ``score`` is the source's k_S(q).
    m = 0 keeps nothing; m >= the number of candidates keeps them all.
    """
    is_candidate = np.asarray(is_candidate, dtype=bool)
    keep = np.zeros_like(is_candidate)
    if m <= 0 or not is_candidate.any():
        return keep
    ranked = np.sort(np.asarray(score)[is_candidate])[::-1]
    threshold = ranked[min(m, ranked.size) - 1]
    return is_candidate & (np.asarray(score) >= threshold)


def balanced_selection(
    k_a: ArrayLike, k_b: ArrayLike, n: int, balance: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. 4 plus GRAFT's balanced exchange for the pair (A, B).

    m = min(|C_{A->B}|, |C_{B->A}|). In each direction the candidates are ranked by the
    source's k_S(q), highest first, and the first m plus every candidate tied with the
    m-th are kept. m = 0 moves nothing. ``balance=False`` (stored-trajectory mode) keeps
    every candidate. Returns (select_a_to_b, select_b_to_a), bool arrays over prompts:
    select_a_to_b[q] means A's group on q replaces B's all-fail group.
    """
    k_a = np.asarray(k_a)
    k_b = np.asarray(k_b)
    c_ab = candidates(k_a, k_b, n)
    c_ba = candidates(k_b, k_a, n)
    if not balance:
        return c_ab, c_ba
    m = int(min(c_ab.sum(), c_ba.sum()))
    return top_m_with_ties(c_ab, k_a, m), top_m_with_ties(c_ba, k_b, m)


@register_transfer("graft")
@dataclass
class GraftTransfer(Transfer):
    """``graft``: each routed group replaces the receiver's all-fail group (Route kind ``graft``),
    its responses gated (Eqs. 6-8) and trained with the donor's advantages, as the ``exchange``
    section's receiver-side options say."""

    routings = ("none", "pair", "pool", "stored")

    def routes(self, triples: list[Triple], inp: ExchangeInput) -> list[Route]:
        return [Route(d, m, q) for d, m, q in triples]
