"""``none`` routing: nothing moves; with any transfer but HACPO's, plain GRPO (the ``none`` preset)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from graftpool.contracts import ExchangeInput
from policies.routing import Routing, Triple, register_routing


@register_routing("none")
@dataclass
class NoRouting(Routing):
    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:
        return []
