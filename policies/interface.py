"""The exchange-policy registry: a policy is one class in one file, registered by name.

A policy turns one step's rollout statistics (:class:`graftpool.contracts.ExchangeInput`)
into routes. It may keep state across steps (a seed counter, say); ``state_dict`` /
``load_state_dict`` carry it through checkpoints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from graftpool.contracts import ExchangeInput, ObjectiveSpec, Route
from graftpool.registry import Registry


class ExchangePolicy:
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

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        return None


POLICIES: Registry[type[ExchangePolicy]] = Registry("policy", "exchange.name")
available_policies = POLICIES.names


def register_policy(name: str) -> Callable[[type[ExchangePolicy]], type[ExchangePolicy]]:
    """Class decorator: make ``cls`` available as ``exchange.name: <name>`` in configs."""

    def wrap(cls: type[ExchangePolicy]) -> type[ExchangePolicy]:
        POLICIES.register(name)(cls)
        cls.name = name
        return cls

    return wrap


def make_policy(name: str, **params: Any) -> ExchangePolicy:
    """Build a registered policy; an unknown name or parameter fails with what is expected."""
    cls = POLICIES.get(name)
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ValueError(
            f"exchange.params: policy {name!r} has no parameter(s) {unknown}; "
            f"expected some of {sorted(fields)}"
        )
    return cls(**params)
