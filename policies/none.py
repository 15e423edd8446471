"""``none``: plain GRPO, every model learns only from its own rollouts."""

from __future__ import annotations

from dataclasses import dataclass

from graftpool.contracts import ExchangeInput, Route
from policies.interface import ExchangePolicy, register_policy


@register_policy("none")
@dataclass
class NoExchange(ExchangePolicy):
    def plan(self, inp: ExchangeInput) -> list[Route]:
        return []
