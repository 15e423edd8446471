"""``hacpo``: HACPO (arXiv 2603.02604), the paper's other baseline: the ``every_prompt`` routing
and the ``hacpo`` transfer (the ``hacpo`` preset).

Every learner k trains on its own group plus every peer's group of every prompt, with
capability-aware advantages and a sequence-level cross ratio (``workers.receiver.objective``,
objective ``sequence``). Formulas are restated in docs/algorithm.md, section 3; "Eq." below is
the HACPO paper's. What the paper leaves open is listed here; each such **[choice]** is a
parameter (or stated here) with the paper's reading as default:

1. ``lb`` is the floor itself, 0.8 (Table 5's "delta" column holds lb).
2. ``peer_baseline``: ``learner`` (App. E Eq. 50 and both codes: the peer's advantage uses the
   learner's baseline mu^(k)) | ``source`` (Eq. 10 read literally: mu^(j)).
3. alpha on the raw s (paper) or on the clipped s (code): the same gradient, because a peer
   outside [lb_m, 1] gets none either way; the loss uses the raw s.
4. A peer with s > 1 gets no gradient (the code's clamp; the paper: never upweighted).
5. ``normalization``: ``group`` (paper, 1/G per term) | ``sequence`` (code, one mean).
6. No KL term (the paper has none; the code's 0.001 needs a reference model).
7. Capability = the mean 0/1 reward (= the positive rate), floored at 1e-8; the ratio clamp
   ``ratio_clamp`` [0.1, 10] (code; null: none); ``warmup_steps`` with w = 1 (default 0).
8. ``guards`` (code only, default on): a prompt whose nG rewards are all equal gets A = 0,
   and mu > 1 falls back to the learner's own mean. The paper's formula without them divides
   a non-zero numerator by sigma = 0 (A ~ 1e6) whenever capabilities differ.
9. m counts every optimizer update of the step, own-only ones included; it resets each
   step (the official code), not each epoch.
10. N > 2: the general formulas below, every ordered pair (k, j).
11. Prompts are short here: no truncation of the re-tokenised peer prompt.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from graftpool.contracts import OWN, PEER, ExchangeInput, ObjectiveSpec, Route
from policies.interface import ParamError
from policies.routing import Routing, Triple, register_routing
from policies.transfer import Transfer, register_transfer

EPS = 1e-6  # Eq. 7's sigma + eps
FLOOR = 1e-8  # the capability floor of the official code


def capability(window: deque | list) -> np.ndarray:
    """P^_t^(k) = (1/K) sum_{tau=t-K+1..t} P_tau^(k) (Eq. 9): the mean of the window's
    per-step mean rewards, [M]; the window includes the current step."""
    return np.maximum(np.mean(np.asarray(window, dtype=float), axis=0), FLOOR)


def capability_ratios(cap: np.ndarray, clamp: tuple[float, float] | None = (0.1, 10.0)) -> np.ndarray:
    """w^(k,j) = P^(k) / P^(j) (Eq. 8), [M k, M j], clamped to ``clamp``; w^(k,k) = 1."""
    cap = np.asarray(cap, dtype=float)
    ratio = cap[:, None] / cap[None, :]
    if clamp is not None:
        ratio = np.clip(ratio, clamp[0], clamp[1])
    np.fill_diagonal(ratio, 1.0)
    return ratio


def baselines(rewards: np.ndarray, w: np.ndarray, guards: bool = True) -> np.ndarray:
    """mu^(k) of every learner on one prompt (Eq. 6-7), [M]:

        mu^(k) = (1 / (nG)) sum_j sum_i w^(k,j) R(y_i^(j))

    ``rewards`` is [M, G]. With ``guards``: all nG rewards equal -> their plain mean (so A = 0);
    mu^(k) > 1 -> the mean of learner k's own rewards."""
    rewards = np.asarray(rewards, dtype=float)
    m, g = rewards.shape
    mu = (w * rewards.sum(axis=1)[None, :]).sum(axis=1) / (m * g)
    if guards:
        if np.all(rewards == rewards.flat[0]):
            return np.full(m, rewards.mean())
        mu = np.where(mu > 1.0, rewards.mean(axis=1), mu)
    return mu


def hacpo_advantages(rewards: np.ndarray, cap: np.ndarray, clamp: tuple[float, float] | None = (0.1, 10.0),
                     peer_coefficient: bool = True, peer_baseline: str = "learner",
                     guards: bool = True) -> np.ndarray:
    """Advantages of one prompt, [M learner k, M source j, G]:

        A^(k)(y_i^(j)) = (R(y_i^(j)) - mu^(b)) / (sigma_joint + 1e-6)         (Eq. 7)
        A~ = w^(j,k) A   for j != k (the capability-discrepancy coefficient, Eq. 10)

    sigma_joint is the unbiased std of the nG raw rewards; b = k (``peer_baseline: learner``)
    or b = j (``source``) for peer rows, b = k for own rows. ``peer_coefficient=False`` drops
    w^(j,k) (the paper's Table 3 ablation). ``rewards`` is [M, G], ``cap`` [M]."""
    rewards = np.asarray(rewards, dtype=float)
    m, g = rewards.shape
    w = capability_ratios(cap, clamp)
    mu = baselines(rewards, w, guards)
    sigma = rewards.std(ddof=1) if rewards.size > 1 else 0.0
    if guards and np.all(rewards == rewards.flat[0]):
        return np.zeros((m, m, g))
    base = np.repeat(mu[:, None], m, axis=1)  # [k, j]: the learner's baseline
    if peer_baseline == "source":
        base = np.where(np.eye(m, dtype=bool), base, mu[None, :])
    elif peer_baseline != "learner":
        raise ValueError(f"exchange.params.peer_baseline: expected 'learner' or 'source', got {peer_baseline!r}")
    adv = (rewards[None, :, :] - base[:, :, None]) / (sigma + EPS)
    if peer_coefficient:
        coef = w.T.copy()  # coef[k, j] = w^(j,k) = P^(j) / P^(k)
        np.fill_diagonal(coef, 1.0)
        adv = adv * coef[:, :, None]
    return adv


@register_routing("every_prompt")
@dataclass
class EveryPrompt(Routing):
    """``every_prompt``: HACPO's sharing: on every prompt, every live model's group goes to every
    live learner, its own included (triples ordered by prompt, learner, source)."""

    def check_pool(self, num_models: int) -> None:
        if num_models < 2:
            raise ValueError(f"shares rollouts among at least 2 models, got {num_models}")

    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:
        if not inp.live.all():
            raise ValueError("routing 'every_prompt' (HACPO) shares live models' groups only; "
                             "stored donors are not supported")
        self.check_pool(len(inp.models))
        m = len(inp.models)
        return [(j, k, q) for q in range(len(inp.prompt_ids)) for k in range(m) for j in range(m)]


@register_transfer("hacpo")
@dataclass
class HacpoTransfer(Transfer):
    """Trains every peer group it is routed (kind ``peer``) and re-weights each learner's own group
    (kind ``own``), both with :func:`hacpo_advantages`; the receivers train them with the
    ``sequence`` objective, own minibatches first. Its advantages need every model's group on
    the prompt, so it fits the ``every_prompt`` routing only."""

    window: PositiveInt = 5  # K of Eq. 9
    ratio_clamp: tuple[float, float] | None = (0.1, 10.0)
    warmup_steps: NonNegativeInt = 0  # steps with every w = 1
    peer_coefficient: bool = True
    peer_baseline: Literal["learner", "source"] = "learner"
    guards: bool = True
    alpha: NonNegativeFloat = 1.0  # Table 5: 1.0 for four of the six pairs, 3.0 for two
    lb: Annotated[float, Field(gt=0, le=1)] = 0.8
    delta_step: NonNegativeFloat = 0.025
    eps_low: NonNegativeFloat = 3e-4
    eps_high: NonNegativeFloat = 4e-4
    normalization: Literal["group", "sequence"] = "group"

    routings = ("every_prompt",)
    receiver_fields = ("peer_placement",)  # no gate; its own objective (``objective``), no peer ratio
    recompute_source = True  # the source's l^j comes from its trainer's pre-update pass (docs/algorithm.md section 3, HACPO)

    def __post_init__(self) -> None:
        if self.ratio_clamp is not None:
            self.ratio_clamp = (float(self.ratio_clamp[0]), float(self.ratio_clamp[1]))
            if not 0 < self.ratio_clamp[0] < self.ratio_clamp[1]:
                raise ParamError("ratio_clamp", f"expected [low, high] with 0 < low < high, got {list(self.ratio_clamp)}")
        self.history: list[list[float]] = []  # P_tau^(k) of the last K steps (state)
        self.steps = 0  # plans made (state: warm-up)

    def usable(self, inp: ExchangeInput) -> np.ndarray:
        """Every group: HACPO learns from every peer group, nothing filtered by success."""
        return np.ones(inp.k.shape, dtype=bool)

    def objective(self, n: int) -> ObjectiveSpec:
        """The receivers' objective: sequence-level (GSPO own, cross ratio peers)."""
        return ObjectiveSpec("sequence", dict(
            eps_low=self.eps_low, eps_high=self.eps_high, alpha=self.alpha, lb=self.lb,
            delta_step=self.delta_step, normalization=self.normalization, group_size=n))

    def capability(self) -> np.ndarray:
        """The current P^ of each model (after the last ``routes``)."""
        return capability(self.history[-self.window:])

    def routes(self, triples: list[Triple], inp: ExchangeInput) -> list[Route]:
        self.history.append(np.nanmean(inp.rewards, axis=(1, 2)).tolist())  # P_t^(k)
        self.history = self.history[-self.window:]
        self.steps += 1
        cap = self.capability()
        if self.steps <= self.warmup_steps:
            cap = np.ones_like(cap)
        adv: dict[int, np.ndarray] = {}  # prompt -> [learner k, source j, n]
        routes: list[Route] = []
        for j, k, q in triples:
            if q not in adv:
                adv[q] = hacpo_advantages(inp.rewards[:, q, :], cap, self.ratio_clamp, self.peer_coefficient,
                                          self.peer_baseline, self.guards)
            kind = OWN if j == k else PEER
            routes.append(Route(j, k, q, kind=kind, advantages=tuple(float(a) for a in adv[q][k, j])))
        return routes

    def state_dict(self) -> dict:
        return {"history": [list(map(float, row)) for row in self.history], "steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.history = [list(row) for row in state.get("history", [])]
        self.steps = int(state.get("steps", len(self.history)))
