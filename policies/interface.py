"""The exchange-policy registry: ``exchange.name`` names an entry, a preset or a plugin class.

A policy turns one step's rollout statistics (:class:`graftpool.contracts.ExchangeInput`)
into routes. It may keep state across steps (a seed counter, say); ``state_dict`` /
``load_state_dict`` carry it through checkpoints. The built-in names (none, graft, pool,
stored, sgt, hacpo) are presets: a routing (``policies.routing``) with a transfer
(``policies.transfer``), composed by ``policies.presets``; a plugin may still register a whole
policy class of its own (:func:`register_policy`).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import numpy as np
from pydantic import Field, TypeAdapter, ValidationError

from graftpool.contracts import ExchangeInput, ObjectiveSpec, Route
from graftpool.registry import Registry

Seed = typing.Annotated[int, Field(ge=0, lt=2**32)]
"""A policy's RNG seed: what numpy's ``default_rng`` takes."""


class KeepsState:
    """What an exchange part (policy, routing, transfer) keeps across steps, carried through
    checkpoints; nothing by default (a part with a seed counter or an RNG overrides both)."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


class ExchangePolicy(KeepsState):
    """Base of every exchange policy. Subclasses are dataclasses whose fields are params."""

    name: str = ""
    # True: the source side of the exchange (the record's mean_logp) must come from the
    # trainers' pre-update pass, never from the sampler's log-probs (workers.training.sampling_logprobs)
    recompute_source: bool = False

    def plan(self, inp: ExchangeInput) -> list[Route]:  # pragma: no cover - interface
        raise NotImplementedError

    def objective(self, n: int) -> ObjectiveSpec | None:
        """The objective the receivers minimise (``workers.receiver.objective.OBJECTIVES``) for groups of
        ``n``; None: the token-level one of Eq. 10 with ``algorithm.eps_low/eps_high``."""
        return None

    # -- what a policy asks of the controller (the controller never reads a policy's name) --

    def check_pool(self, num_models: int) -> None:
        """Raise ValueError (naming ``exchange.name``) when the policy cannot serve this many models."""
        return None

    def donor_groups(self, inp: ExchangeInput) -> np.ndarray:
        """[M, P] bool: the groups that may donate (Eq. 4's ``1 <= k < n`` unless the policy's
        transfer takes others); the compatibility pass scores these."""
        k = inp.k
        return (k >= 1) & (k < inp.n)

    @property
    def needs_compatibility(self) -> bool:
        """True: before routing, the controller scores every eligible donor group under each
        receiver's old weights (``ExchangeInput.compatibility``)."""
        return False

    def stored_donors(self) -> list[Any]:
        """Donors that are not live models (``policies.stored.StoredPeers``), read before the run."""
        return []

    def trainer_params(self) -> dict[str, Any]:
        """Trainer settings this policy sets on every rank (e.g. SGT's lambda): names of
        ``workers.training.settings.TrainerSettings`` fields; any other name fails at start."""
        return {}



class ParamError(ValueError):
    """A bad parameter of a routing, a transfer or a plugin policy: ``param`` (None: the
    parameters as a whole) and why; the factory names the config field it came from."""

    def __init__(self, param: str | None, reason: str, field: str = "exchange.params"):
        self.param, self.reason = param, reason
        super().__init__(f"{field}.{param}: {reason}" if param else f"{field}: {reason}")

    def named(self, field: str) -> ParamError:
        """The same error, naming ``field`` (``exchange.routing``, ``exchange.transfer``)."""
        return ParamError(self.param, self.reason, field)


POLICIES: Registry[Any] = Registry("policy", "exchange.name")  # a preset (policies.presets) or a policy class
available_policies = POLICIES.names


def register_policy(name: str) -> Callable[[type[ExchangePolicy]], type[ExchangePolicy]]:
    """Class decorator: make ``cls`` available as ``exchange.name: <name>`` in configs."""
    return POLICIES.register_named(name)


def make_policy(name: str, **params: Any) -> ExchangePolicy:
    """Build a registered policy (a preset's routing and transfer, or a plugin class) from
    ``exchange.params``; an unknown name or parameter fails with what is expected."""
    entry = POLICIES.get(name)
    if not isinstance(entry, type):  # a preset: policies.presets.Preset
        return entry.build(params)
    return build(entry, name, params, "exchange.params", "policy")


def build(cls: type, name: str, params: dict[str, Any], field: str, what: str) -> Any:
    """``cls(**params)`` with ``params`` checked against its dataclass fields and typed
    (:func:`typed_params`); an error names ``field`` (``exchange.params``, ``exchange.routing``...)."""
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(f"{field}: {what} {name!r} has no parameter(s) {unknown}; expected some of {sorted(fields)}")
    try:
        return cls(**typed_params(cls, params, field))
    except ParamError as exc:
        raise exc.named(field) from None


def typed_params(cls: type, params: dict[str, Any], field: str = "exchange.params") -> dict[str, Any]:
    """``params`` converted to the types (and bounds, ``Annotated[..., Field(...)]``) the policy's
    fields declare, as every other config field is: ``off`` / ``no`` are False, ``"3e-4"`` (how
    YAML reads it) is 0.0003; a value that does not fit fails naming ``<field>.<name>``."""
    hints = typing.get_type_hints(cls, include_extras=True)
    typed = {}
    for key, value in params.items():
        try:
            typed[key] = TypeAdapter(hints[key]).validate_python(value)
        except ValidationError as exc:
            expected = typing.get_type_hints(cls)[key]  # the type without its bounds, to name it
            name = (" | ".join(map(repr, typing.get_args(expected))) if typing.get_origin(expected) is typing.Literal
                    else expected.__name__ if isinstance(expected, type) else str(expected))
            reason = "; ".join(error["msg"] for error in exc.errors())
            raise ValueError(f"{field}.{key}: expected {name} ({reason}), got {value!r}") from None
    return typed
