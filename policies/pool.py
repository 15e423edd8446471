"""Pool-wide routing of all-fail prompts across N models (docs/algorithm.md section 4): the
``pool`` routing, and ``pair`` (GRAFT's balanced pair, the pool routing of two models).

``route`` generalises pair GRAFT: every (receiver m, prompt q) where m failed all n
rollouts may take the group of one eligible donor d (k_m(q) = 0 and d's group usable by the
transfer: 1 <= k_d(q) < n for GRAFT, Eq. 4; k_d(q) >= 1 for SGT). Which pairs may move is set
by the balance mode, and which donor serves by the donor strategy. With N = 2,
``most_successes`` and ``pairwise`` it routes exactly what pair GRAFT
(``policies.graft.balanced_selection``) routes; a test holds it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike

from graftpool.contracts import ExchangeInput
from graftpool.eligibility import eligibility
from policies.graft import top_m_with_ties
from policies.interface import Seed
from policies.routing import Routing, Triple, register_routing

Donor = Literal["most_successes", "most_compatible", "least_used", "random"]
Balance = Literal["pairwise", "pool", "none"]
DONOR_STRATEGIES: tuple[str, ...] = get_args(Donor)
BALANCE_MODES: tuple[str, ...] = get_args(Balance)


def check_names(donor: str, balance: str) -> None:
    if donor not in DONOR_STRATEGIES:
        raise ValueError(f"exchange.params.donor must be one of {DONOR_STRATEGIES}, got {donor!r}")
    if balance not in BALANCE_MODES:
        raise ValueError(f"exchange.params.balance must be one of {BALANCE_MODES}, got {balance!r}")


def _balance_pairwise(eligible: np.ndarray, k: np.ndarray) -> np.ndarray:
    """GRAFT's balanced exchange applied to every unordered pair (a, b)."""
    allowed = np.zeros_like(eligible)
    num_models = k.shape[0]
    for a in range(num_models):
        for b in range(a + 1, num_models):
            m = int(min(eligible[a, b].sum(), eligible[b, a].sum()))
            allowed[a, b] = top_m_with_ties(eligible[a, b], k[a], m)
            allowed[b, a] = top_m_with_ties(eligible[b, a], k[b], m)
    return allowed


def _balance_pool(eligible: np.ndarray, k: np.ndarray, receivers: Sequence[int]) -> np.ndarray:
    """One common target for all receivers: m = min over receivers of their candidate count.

    A receiver's candidates are its all-fail prompts with at least one eligible donor,
    ranked by the best eligible donor's k (GRAFT's ranking); top m plus ties are kept.
    """
    has_donor = eligible.any(axis=0)  # [M receiver, P]
    target = min(int(has_donor[m].sum()) for m in receivers) if len(receivers) else 0
    best_k = np.where(eligible, k[:, None, :], -1).max(axis=0)  # [M receiver, P]
    allowed = np.zeros_like(eligible)
    for m in receivers:
        keep = top_m_with_ties(has_donor[m], best_k[m], target)
        allowed[:, m, :] = eligible[:, m, :] & keep[None, :]
    return allowed


def _choose_donor(
    options: np.ndarray,
    k_column: np.ndarray,
    strategy: str,
    compat_column: np.ndarray | None,
    load: np.ndarray,
    rng: np.random.Generator,
) -> int:
    """Pick one donor index among ``options`` (ascending ints) for one (receiver, prompt)."""
    if strategy == "random":
        return int(rng.choice(options))
    if strategy == "most_successes":
        keys = [(-k_column[d], d) for d in options]
    elif strategy == "most_compatible":
        assert compat_column is not None
        keys = [
            (-(compat_column[d] if np.isfinite(compat_column[d]) else -np.inf), -k_column[d], d)
            for d in options
        ]
    elif strategy == "least_used":
        keys = [(load[d], -k_column[d], d) for d in options]
    else:  # pragma: no cover - guarded by route()
        raise ValueError(strategy)
    return int(min(keys)[-1])


def route(
    k: ArrayLike,
    n: int,
    donor: str = "most_successes",
    balance: str = "pairwise",
    compatibility: ArrayLike | None = None,
    seed: int = 0,
    receivers: Sequence[int] | None = None,
    donors: Sequence[int] | None = None,
    usable: ArrayLike | None = None,
) -> list[tuple[int, int, int]]:
    """Route all-fail prompts across a pool: a list of (donor, receiver, prompt).

    ``k`` is [M, P] success counts (a negative entry means "no group", e.g. a stored
    donor without that prompt). ``compatibility`` is [M donor, M receiver, P] mean gate
    score s (NaN where not scored), required by ``donor="most_compatible"``. A receiver
    gets at most one donor group per prompt. ``receivers``/``donors`` restrict the roles
    (stored-peer mode: live models receive, stored rows donate); ``usable`` ([M, P] bool, default
    Eq. 4's mixed groups) are the groups the transfer can learn from. Routes are ordered by
    receiver, then prompt.
    """
    check_names(donor, balance)
    k = np.asarray(k, dtype=int)
    if k.ndim != 2:
        raise ValueError(f"k must be [models, prompts], got shape {k.shape}")
    compat = None if compatibility is None else np.asarray(compatibility, dtype=float)
    if donor == "most_compatible":
        if compat is None or compat.shape != (k.shape[0], k.shape[0], k.shape[1]):
            raise ValueError(
                "donor='most_compatible' needs compatibility of shape [M, M, P] "
                f"= {(k.shape[0], k.shape[0], k.shape[1])}"
            )

    eligible = eligibility(k, n, receivers, donors, None if usable is None else np.asarray(usable, dtype=bool))
    receiver_ids = list(range(k.shape[0])) if receivers is None else sorted(receivers)
    if balance == "pairwise":
        allowed = _balance_pairwise(eligible, k)
    elif balance == "pool":
        allowed = _balance_pool(eligible, k, receiver_ids)
    else:
        allowed = eligible

    rng = np.random.default_rng(seed)
    load = np.zeros(k.shape[0], dtype=int)
    routes: list[tuple[int, int, int]] = []
    for m in receiver_ids:
        for q in np.flatnonzero(allowed[:, m, :].any(axis=0)):
            options = np.flatnonzero(allowed[:, m, q])
            compat_column = None if compat is None else compat[:, m, q]
            d = _choose_donor(options, k[:, q], donor, compat_column, load, rng)
            load[d] += 1
            routes.append((d, int(m), int(q)))
    return routes


@register_routing("pool")
@dataclass
class PoolRouting(Routing):
    """``pool``: N-model routing with a donor strategy and a balance mode (docs/algorithm.md section 4)."""

    donor: Donor = "most_successes"
    balance: Balance = "pairwise"
    seed: Seed = 0

    def __post_init__(self) -> None:
        self._step = 0

    @property
    def needs_compatibility(self) -> bool:
        return self.donor == "most_compatible"

    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:
        live = np.flatnonzero(inp.live).tolist()
        routes = route(
            inp.k,
            inp.n,
            donor=self.donor,
            balance=self.balance,
            compatibility=inp.compatibility,
            seed=self.seed + self._step,
            receivers=live,
            donors=live,
            usable=usable,
        )
        self._step += 1
        return routes

    def state_dict(self) -> dict:
        return {"step": self._step}

    def load_state_dict(self, state: dict) -> None:
        self._step = int(state.get("step", 0))


@register_routing("pair")
@dataclass
class PairRouting(Routing):
    """``pair``: the paper's balanced exchange between exactly two live models: the pool routing
    of their two rows with ``most_successes`` and ``pairwise`` balance, which routes what
    :func:`balanced_selection` selects (a property test holds it); ``balance=False`` turns the
    balanced exchange off (every candidate moves)."""

    balance: bool = True

    def check_pool(self, num_models: int) -> None:
        if num_models != 2:
            raise ValueError(f"pairs exactly 2 models, got {num_models}; use 'pool'")

    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:
        live = np.flatnonzero(inp.live).tolist()
        self.check_pool(len(live))
        return route(inp.k, inp.n, donor="most_successes", balance="pairwise" if self.balance else "none",
                     receivers=live, donors=live, usable=usable)
