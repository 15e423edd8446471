"""``sgt``: the success-gated transfer baseline (docs/algorithm.md section 3), as a transfer.

On a receiver's all-fail prompt routed a donor group with at least one success, ``count`` of
the donor's correct responses, drawn uniformly without replacement (seeded), are added to the
receiver's loss as coef * NLL (``workers.receiver.objective.sgt_loss``, Route kind ``sgt``).
Nothing else moves; no gate. The ``sgt`` preset routes it with ``pool`` routing,
``donor: most_successes`` and ``balance: none``: the donor is the peer with the most successes
on the prompt (ties: the lower index), which was the SGT policy's own rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import NonNegativeFloat, PositiveInt

from graftpool.contracts import SGT, SUCCESS_THRESHOLD, ExchangeInput, Route
from policies.interface import Seed
from policies.routing import Triple
from policies.transfer import Transfer, register_transfer


@register_transfer("sgt")
@dataclass
class SuccessGatedTransfer(Transfer):
    coef: NonNegativeFloat = 0.1  # lambda of the NLL term, given to the trainers (trainer_params)
    count: PositiveInt = 1  # correct responses per route (all of them where the group has fewer)
    seed: Seed = 0

    routings = ("none", "pair", "pool", "stored")
    receiver_fields = ("peer_placement",)  # no gate; its rows' loss is coef * NLL, no peer ratio

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def usable(self, inp: ExchangeInput) -> np.ndarray:
        """A group with at least one success (k >= 1): an all-pass group teaches SGT too."""
        return inp.k >= 1

    def trainer_params(self) -> dict:
        return {"sgt_coef": float(self.coef)}

    def routes(self, triples: list[Triple], inp: ExchangeInput) -> list[Route]:
        routes = []
        for d, m, q in triples:
            correct = np.flatnonzero(inp.rewards[d, q] > SUCCESS_THRESHOLD)
            if self.count == 1:
                samples: tuple[int, ...] = (int(self._rng.choice(correct)),)
            else:
                drawn = self._rng.choice(correct, size=min(self.count, correct.size), replace=False)
                samples = tuple(sorted(int(i) for i in drawn))
            routes.append(Route(d, m, q, kind=SGT, samples=samples))
        return routes

    def state_dict(self) -> dict:
        return {"rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        if "rng" in state:
            self._rng.bit_generator.state = state["rng"]
