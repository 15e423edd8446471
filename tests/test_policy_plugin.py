"""Proof that an exchange policy plugs in as one file: this module registers ``every-candidate``
(GRAFT's candidates, Eq. 4, with no balancing, admitted through a looser gate that the policy
asks of the trainers) and runs the demo pair end to end with it. Nothing outside this file knows
the policy's name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from graftpool.contracts import ExchangeInput, Route
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import train
from policies.graft import candidates
from policies.interface import ExchangePolicy, register_policy
from tests.platform_checks import check_store, own_successes, read_store

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"
SMALL = ["run.steps=1", "algorithm.prompt_batch=16", "run.eval_every=0", "data.eval=[]"]

pytestmark = pytest.mark.slow


@register_policy("every-candidate")
@dataclass
class EveryCandidate(ExchangePolicy):
    """Every Eq. 4 candidate of every ordered pair moves (no balance); the gate's delta is the
    policy's own parameter, handed to every trainer rank."""

    delta: float = 0.5

    def check_pool(self, num_models: int) -> None:
        if num_models < 2:
            raise ValueError(f"exchange.name: 'every-candidate' needs 2 or more models, got {num_models}")

    def trainer_params(self) -> dict:
        return {"delta": self.delta}

    def plan(self, inp: ExchangeInput) -> list[Route]:
        k, live = inp.k, np.flatnonzero(inp.live)
        routes = []
        for receiver in live:
            taken = np.zeros(k.shape[1], dtype=bool)
            for donor in (d for d in live if d != receiver):
                fresh = candidates(k[donor], k[receiver], inp.n) & ~taken  # one donor group per prompt
                routes += [Route(int(donor), int(receiver), int(q)) for q in np.flatnonzero(fresh)]
                taken |= fresh
        return routes


def test_a_policy_in_one_file_runs_a_pair_end_to_end(tmp_path, ray_local):
    with pytest.raises(ConfigError, match="needs 2 or more models"):
        load_config(DEMO, [*SMALL, "exchange.name=every-candidate", "models=[{name: a, builder: {arch: llama, tokenizer: char}}]"])
    config = load_config(DEMO, [*SMALL, "exchange.name=every-candidate", "exchange.params={delta: 0.3}",
                                f"run.output_dir={tmp_path}", "run.name=plugin"])
    summary = train(config)
    rows = read_store(tmp_path / "plugin")
    names = [m.name for m in config.models]
    # the store's invariants with the policy's delta: Eq. 4, whole groups, w = min(s, 1) above 0.3
    grafted = check_store(rows, config.algorithm.n, 0.3, 1, 16, names)
    k = own_successes(rows)
    expected = sum(1 for (step, receiver, prompt), kr in k.items() if kr == 0 and any(
        1 <= k.get((step, donor, prompt), 0) < config.algorithm.n for donor in names if donor != receiver))
    assert grafted == expected > 0, "every candidate moved: no balancing"
    assert sum(m["exchange"]["received"] for m in summary["models"].values()) == grafted
