"""``sgt``: the success-gated transfer baseline (docs/algorithm.md section 3).

On a receiver's all-fail prompt where a peer has at least one success, one of the
peer's correct responses, drawn uniformly (seeded), is added to the receiver's loss as
coef * NLL (``workers.receiver.objective.sgt_loss``). Nothing else moves; no balancing, no gate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import NonNegativeFloat

from graftpool.contracts import SGT, SUCCESS_THRESHOLD, ExchangeInput, Route
from policies.interface import ExchangePolicy, Seed, register_policy


@register_policy("sgt")
@dataclass
class SuccessGatedTransfer(ExchangePolicy):
    coef: NonNegativeFloat = 0.1  # lambda of the NLL term, given to the trainers (trainer_params)
    seed: Seed = 0

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def trainer_params(self) -> dict:
        return {"sgt_coef": float(self.coef)}

    def plan(self, inp: ExchangeInput) -> list[Route]:
        k = inp.k
        live = np.flatnonzero(inp.live)
        routes: list[Route] = []
        for m in live:
            for q in np.flatnonzero(k[m] == 0):
                donors = [d for d in live if d != m and k[d, q] >= 1]
                if not donors:
                    continue
                d = min(donors, key=lambda i: (-k[i, q], i))
                correct = np.flatnonzero(inp.rewards[d, q] > SUCCESS_THRESHOLD)
                sample = int(self._rng.choice(correct))
                routes.append(Route(int(d), int(m), int(q), kind=SGT, samples=(sample,)))
        return routes

    def state_dict(self) -> dict:
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]
