"""``algorithm:`` (the RL update every model runs) and ``exchange:`` (the exchange policy and
how a receiver takes in the peer data it routes).

Every option of an exchange lives under ``exchange``. The receiver-side ones (the gate, the
peer advantages, where peer rows go, the peer ratio) were ``algorithm.*`` keys before; for one
release they are still read there, with a deprecation warning naming the new key
(:func:`move_exchange_keys`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from orchestrator.config.base import Strict
from workers.receiver.gate_kinds import GATE_KINDS
from workers.receiver.minibatch import PLACEMENTS
from workers.receiver.peer_transfer import PEER_ADVANTAGES


class AlgorithmConfig(Strict):
    n: int = Field(8, ge=2, description="responses per prompt")
    prompt_batch: int = Field(128, ge=1)
    eps_low: float = Field(0.2, ge=0, lt=1)  # the clip's floor 1 - eps_low stays above 0
    eps_high: float = Field(0.28, ge=0)
    minibatches: int = Field(4, ge=1)
    # how the step's rows become minibatches (workers.receiver.minibatch): rows (verl: equal runs of the
    # ordered rows, a fixed number of optimizer steps) | groups (whole groups; a gated-out group keeps its slot)
    minibatch_split: Literal["rows", "groups"] = "rows"
    epochs: int = Field(1, ge=1)
    # a minibatch's token-mean denominator (workers.receiver.objective): minibatch (paper) | step
    loss_normalizer: Literal["minibatch", "step"] = "minibatch"
    # where pi_old comes from (workers.training.sampling_logprobs): auto skips the extra forward pass when the
    # update is one optimizer step (exactly on-policy) and takes the behaviour log-probs under run.async
    # one_step; recompute always runs the pass; sampling takes the behaviour log-probs
    old_logprobs: Literal["auto", "recompute", "sampling"] = "auto"


class ExchangeConfig(Strict):
    """The policy that routes peer groups, and how a receiver takes them in (defaults: the paper's).

    Either ``name`` (a preset of a routing and a transfer, or a plugin policy) with ``params``,
    or ``routing`` and ``transfer``, each a name or ``{name: ..., <param>: ...}``
    (``policies.presets.make_exchange``, which checks them at load)."""

    name: str | None = None  # None with no routing / transfer: graft
    params: dict[str, Any] = Field(default_factory=dict)  # the preset's or policy's options (policies/)
    routing: dict[str, Any] | None = None  # policies.routing: none | pair | pool | stored | every_prompt
    transfer: dict[str, Any] | None = None  # policies.transfer: graft | luffy | sgt | hacpo
    delta: float = Field(0.8, ge=0)  # the gate's threshold on s (Eq. 8)
    gate: bool = True  # False: the no-gate ablation (w = 1 for every grafted response)
    gate_scope: Literal["response", "group"] = "response"  # group: admit or drop a group on its mean s
    # what s is computed on (workers.receiver.gate_kinds): token_mean (paper) | per_byte | answer_masked | self_calibrated
    gate_kind: str = "token_mean"
    # how a receiver takes in a donor group (workers.receiver.peer_transfer)
    peer_responses: Literal["all", "success"] = "all"  # success: only the donor's correct responses
    peer_advantages: str = "donor"  # donor | pooled | recentered | asymmetric
    peer_beta: float = Field(0.5, ge=0, le=1)  # asymmetric: the scale of negative peer advantages
    # where peer groups go among the minibatches (workers.receiver.minibatch): last (paper) | first | spread
    peer_placement: str = "last"
    # peer tokens' term in Eq. 10 (workers.receiver.objective): clip (paper) | shaped (LUFFY's f(pi) = pi / (pi + gamma))
    peer_ratio: Literal["clip", "shaped"] = "clip"
    shaping_gamma: float = Field(0.1, gt=0)  # LUFFY's gamma (peer_ratio: shaped)

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

    @field_validator("peer_advantages", "peer_placement", "gate_kind")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        registry = {"peer_advantages": PEER_ADVANTAGES, "peer_placement": PLACEMENTS,
                    "gate_kind": GATE_KINDS}[info.field_name]
        if name not in registry.names():
            raise ValueError(f"expected one of {registry.names()}, got {name!r}")
        return name


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
