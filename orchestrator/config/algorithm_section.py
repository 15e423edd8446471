"""``algorithm:`` (the RL update every model runs) and ``exchange:`` (the exchange policy and
how a receiver takes in the peer data it routes).

Every option of an exchange lives under ``exchange``. The receiver-side ones (the gate, the
peer advantages, where peer rows go, the peer ratio) were ``algorithm.*`` keys before; for one
release they are still read there, with a deprecation warning naming the new key
(:func:`move_exchange_keys`).
"""

from __future__ import annotations

import warnings
from typing import Any

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from workers.training.settings import ReceiverSection, UpdateSection


class AlgorithmConfig(UpdateSection):
    """``algorithm``: the batch, and the update every model runs (``UpdateSection``: the clip,
    minibatches, epochs, the loss normaliser, pi_old)."""

    n: int = Field(8, ge=2, description="responses per prompt")
    prompt_batch: int = Field(128, ge=1)


class ExchangeConfig(ReceiverSection):
    """The policy that routes peer groups, and how a receiver takes them in (defaults: the paper's).

    Either ``name`` (a preset of a routing and a transfer, or a plugin policy) with ``params``,
    or ``routing`` and ``transfer``, each a name or ``{name: ..., <param>: ...}``
    (``policies.presets.make_exchange``, which checks them at load). How a receiver takes the
    peer data in (the gate, peer advantages, placement, ratio) is ``ReceiverSection``'s."""

    name: str | None = None  # None with no routing / transfer: graft
    params: dict[str, Any] = Field(default_factory=dict)  # the preset's or policy's options (policies/)
    routing: dict[str, Any] | None = None  # policies.routing: none | pair | pool | stored | every_prompt
    transfer: dict[str, Any] | None = None  # policies.transfer: graft | luffy | sgt | hacpo

    @model_validator(mode="before")
    @classmethod
    def _default_preset(cls, data: Any) -> Any:
        """No name, routing or transfer: the ``graft`` preset."""
        if isinstance(data, dict) and all(data.get(key) is None for key in ("name", "routing", "transfer")):
            return {**data, "name": "graft"}
        return data

    @field_validator("routing", "transfer", mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        """A bare name is ``{name: <it>}``; a mapping must name its entry."""
        if isinstance(value, str):
            return {"name": value}
        if isinstance(value, dict) and not isinstance(value.get("name"), str):
            raise ValueError(f"expected a name or a mapping with a 'name' and its params, got {value!r}")
        return value

    def policy(self) -> Any:
        """The exchange policy this section asks for (``policies.ExchangePolicy``); a bad name,
        parameter or pairing raises ValueError naming the field."""
        from policies import make_exchange  # here: the config is read before any policy is needed

        return make_exchange(self.name, self.params, self.routing, self.transfer)


MOVED_TO_EXCHANGE = ("delta", "gate", "gate_scope", "peer_responses", "peer_advantages", "peer_beta",
                     "peer_placement", "peer_ratio", "shaping_gamma")


def move_exchange_keys(data: Any) -> Any:
    """A raw config with the older ``algorithm.<key>`` spellings of the exchange options moved to
    ``exchange.<key>``, each with a DeprecationWarning; ``algorithm.peer_last: false`` (the older
    switch) is ``exchange.peer_placement: first``. The same key given in both places with
    different values is an error naming both."""
    if not isinstance(data, dict) or not isinstance(data.get("algorithm"), dict):
        return data
    algorithm, exchange = dict(data["algorithm"]), dict(data.get("exchange") or {})
    moved = {key: algorithm.pop(key) for key in MOVED_TO_EXCHANGE if key in algorithm}
    if "peer_last" in algorithm:
        peer_last = algorithm.pop("peer_last")
        try:
            peer_last = TypeAdapter(bool).validate_python(peer_last)
        except ValidationError:
            raise ValueError(f"algorithm.peer_last: expected true or false, got {peer_last!r}") from None
        if peer_last is False:
            if moved.get("peer_placement", "first") not in ("last", "first"):
                raise ValueError(f"algorithm.peer_last: false asks for peer_placement 'first', but "
                                 f"peer_placement is {moved['peer_placement']!r}; set only exchange.peer_placement")
            moved["peer_placement"] = "first"
        warnings.warn("algorithm.peer_last is deprecated: use exchange.peer_placement (last | first | spread)",
                      DeprecationWarning, stacklevel=2)
    for key, value in moved.items():
        if key in exchange and exchange[key] != value:
            raise ValueError(f"algorithm.{key} ({value!r}) and exchange.{key} ({exchange[key]!r}) disagree; "
                             f"algorithm.{key} is the older spelling: give exchange.{key} only")
        if key in data["algorithm"]:
            warnings.warn(f"algorithm.{key} is deprecated: it moved to exchange.{key}", DeprecationWarning,
                          stacklevel=2)
        exchange[key] = value
    return {**data, "algorithm": algorithm, "exchange": exchange}
