"""An exchange is a routing and a transfer (``exchange.routing`` x ``exchange.transfer``); the
older policy names (``exchange.name``) are presets of the two.

=========  ================================================  =========  =================
preset     routing                                           transfer   exchange.params
=========  ================================================  =========  =================
none       none                                              graft      (none)
graft      pair                                              graft      the routing's
pool       pool                                              graft      the routing's
stored     stored                                            graft      the routing's
sgt        pool (donor: most_successes, balance: none)       sgt        the transfer's
hacpo      every_prompt                                      hacpo      the transfer's
=========  ================================================  =========  =================

Each preset routes and trains exactly what its policy did before the split (the demo's
trajectory store is byte-identical; tests/test_routing_transfer.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from graftpool.contracts import ExchangeInput, ObjectiveSpec, Route
from policies.interface import POLICIES, ExchangePolicy
from policies.routing import Routing, make_routing
from policies.transfer import Transfer, make_transfer


class Exchange(ExchangePolicy):
    """A routing and a transfer as one exchange policy: the routing's triples over the groups
    the transfer can use, made into routes by the transfer. ``label`` names it in errors
    (``exchange.name: 'sgt'`` for a preset, ``exchange.routing: 'pool'`` otherwise)."""

    def __init__(self, routing: Routing, transfer: Transfer, name: str, label: str):
        self.routing, self.transfer, self.name, self.label = routing, transfer, name, label

    @property
    def recompute_source(self) -> bool:  # type: ignore[override]
        return self.transfer.recompute_source

    @property
    def needs_compatibility(self) -> bool:
        return self.routing.needs_compatibility

    def donor_groups(self, inp: ExchangeInput) -> np.ndarray:
        return self.transfer.usable(inp)

    def check_pool(self, num_models: int) -> None:
        try:
            self.routing.check_pool(num_models)
        except ValueError as exc:
            raise ValueError(f"{self.label} {exc}") from None

    def plan(self, inp: ExchangeInput) -> list[Route]:
        return self.transfer.routes(self.routing.plan(inp, self.transfer.usable(inp)), inp)

    def objective(self, n: int) -> ObjectiveSpec | None:
        return self.transfer.objective(n)

    def stored_donors(self) -> list[Any]:
        return self.routing.stored_donors()

    def trainer_params(self) -> dict[str, Any]:
        modules = self.transfer.kind_modules()
        return {**self.transfer.trainer_params(), **({"kind_modules": modules} if modules else {})}

    def state_dict(self) -> dict:
        """The routing's state and the transfer's, side by side (their keys differ: a preset's
        checkpoint holds what its policy's did)."""
        routing, transfer = self.routing.state_dict(), self.transfer.state_dict()
        assert not set(routing) & set(transfer), f"routing and transfer state share keys {set(routing) & set(transfer)}"
        return {**routing, **transfer}

    def load_state_dict(self, state: dict) -> None:
        self.routing.load_state_dict(state)
        self.transfer.load_state_dict(state)


def compose(routing: str, routing_params: dict[str, Any], transfer: str, transfer_params: dict[str, Any],
            preset: str | None = None) -> Exchange:
    """The exchange of ``routing`` with ``transfer``; a pair that does not fit is refused naming
    both fields. ``preset``: the ``exchange.name`` it stands for (its params are ``exchange.params``)."""
    r_field, t_field = ("exchange.params", "exchange.params") if preset else ("exchange.routing", "exchange.transfer")
    made_routing = make_routing(routing, routing_params, r_field)
    made_transfer = make_transfer(transfer, transfer_params, t_field)
    if made_routing.name not in made_transfer.routings:
        raise ValueError(f"exchange.routing {routing!r} and exchange.transfer {transfer!r} do not fit: "
                         f"the transfer {transfer!r} takes the routings {list(made_transfer.routings)}")
    if preset:
        return Exchange(made_routing, made_transfer, preset, f"exchange.name: {preset!r}")
    return Exchange(made_routing, made_transfer, f"{routing}+{transfer}", f"exchange.routing: {routing!r}")


@dataclass(frozen=True)
class Preset:
    """An ``exchange.name``: a routing and a transfer, with fixed params for either, and which of
    the two takes ``exchange.params``."""

    name: str
    routing: str
    transfer: str
    params_to: Literal["routing", "transfer"]
    routing_params: dict[str, Any] = field(default_factory=dict)
    transfer_params: dict[str, Any] = field(default_factory=dict)

    def build(self, params: dict[str, Any]) -> Exchange:
        routing, transfer = dict(self.routing_params), dict(self.transfer_params)
        (routing if self.params_to == "routing" else transfer).update(params)
        return compose(self.routing, routing, self.transfer, transfer, preset=self.name)


PRESETS = [
    Preset("none", "none", "graft", "routing"),
    Preset("graft", "pair", "graft", "routing"),
    Preset("pool", "pool", "graft", "routing"),
    Preset("stored", "stored", "graft", "routing"),
    Preset("sgt", "pool", "sgt", "transfer", routing_params={"donor": "most_successes", "balance": "none"}),
    Preset("hacpo", "every_prompt", "hacpo", "transfer"),
]
for _preset in PRESETS:
    POLICIES.register(_preset.name)(_preset)


def make_exchange(name: str | None = None, params: dict[str, Any] | None = None,
                  routing: dict[str, Any] | None = None, transfer: dict[str, Any] | None = None) -> ExchangePolicy:
    """The exchange an ``exchange`` config section asks for: ``name`` (a preset or a plugin
    policy) with ``params``, or ``routing`` and ``transfer`` (each ``{name: ..., <params>}``;
    one left out is ``pool`` / ``graft``). Giving both ways, or ``params`` with the second,
    fails naming the fields."""
    params = dict(params or {})
    if routing is None and transfer is None:
        from policies.interface import make_policy

        return make_policy(name or "graft", **params)
    if name is not None:
        raise ValueError(f"exchange.name ({name!r}) is a preset of a routing and a transfer; give it or "
                         f"exchange.routing / exchange.transfer, not both (exchange.name: null drops it)")
    if params:
        raise ValueError("exchange.params are a preset's (exchange.name); with exchange.routing and "
                         "exchange.transfer, give each its params inside it ({name: ..., <param>: ...})")
    routing, transfer = dict(routing or {"name": "pool"}), dict(transfer or {"name": "graft"})
    return compose(routing.pop("name"), routing, transfer.pop("name"), transfer)
