"""The routing registry: who gives which prompt's group to whom (``exchange.routing``).

A routing turns one step's rollout statistics into donor-receiver-prompt triples; what a
receiver does with the group it is routed is the transfer's (``policies.transfer``). The
routings: ``none`` (policies/none.py), ``pair`` (GRAFT's balanced pair, policies/graft.py),
``pool`` (policies/pool.py), ``stored`` (policies/stored.py) and ``every_prompt`` (HACPO's
sharing, policies/hacpo.py). A routing is a dataclass whose fields are its parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graftpool.contracts import ExchangeInput
from graftpool.registry import Registry
from policies.interface import KeepsState, build

Triple = tuple[int, int, int]
"""(donor, receiver, prompt): indices into the rows and prompts of the ``ExchangeInput``."""


class Routing(KeepsState):
    """Base of every routing. ``plan`` gets ``usable`` ([M, P] bool), the groups the transfer can
    learn from (GRAFT: mixed groups, 1 <= k < n; SGT: a group with a success, k >= 1)."""

    name: str = ""
    donor_tokens: bool = True  # every donor row carries its tokens and per-token log-probs (a stored donor: text only)

    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:  # pragma: no cover - interface
        raise NotImplementedError

    def check_pool(self, num_models: int) -> None:
        """Raise ValueError (what it needs, without the field: the caller names it) when the
        routing cannot serve this many models."""
        return None

    @property
    def needs_compatibility(self) -> bool:
        """True: the controller scores every usable donor group under each receiver's old weights
        first (``ExchangeInput.compatibility``)."""
        return False

    def stored_donors(self) -> list[Any]:
        """Donors that are not live models (``policies.stored.StoredPeers``), read before the run."""
        return []



ROUTINGS: Registry[type[Routing]] = Registry("routing", "exchange.routing")
available_routings = ROUTINGS.names


register_routing = ROUTINGS.register_named
"""Class decorator: make ``cls`` available as ``exchange.routing: <name>``."""


def make_routing(name: str, params: dict[str, Any], field: str = "exchange.routing") -> Routing:
    """A registered routing with ``params`` typed and checked; errors name ``field``."""
    return build(ROUTINGS.get(name), name, params, field, "routing")
