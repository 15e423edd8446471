"""Glue between rollouts and the exchange policy: groups in, per-receiver batches out.

Pure Python/NumPy: the controller calls it between the verify and train phases.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from graftpool.contracts import GRAFT, OWN, PEER, SGT, ExchangeInput, RolloutGroup, Route
from graftpool.tasks import Problem
from orchestrator.cluster.model_actors import ModelActors, get_all
from policies.pool import eligibility
from workers.receiver.objective import grpo_advantages
from workers.receiver.peer_transfer import compatibility_scores
from workers.rollout.generation import Completion
from workers.training.trainer import Graft, PeerGroup, SGTItem


def build_groups(model: str, problems: list[Problem], completions: list[Completion],
                 rewards: np.ndarray, reasons: list[list[str]]) -> list[RolloutGroup]:
    """One RolloutGroup per prompt with GRPO advantages (Eq. 1) on the full group."""
    advantages = grpo_advantages(torch.as_tensor(rewards, dtype=torch.float32)).numpy()
    return [
        RolloutGroup(model=model, prompt_id=p.prompt_id, prompt=p.prompt, responses=c.responses,
                     token_ids=c.token_ids, gen_logprobs=c.logprobs, rewards=rewards[i],
                     policy_version=c.policy_version, advantages=advantages[i].astype(float),
                     reasons=reasons[i], finished=c.finished, rendered_prompt=c.prompt)
        for i, (p, c) in enumerate(zip(problems, completions, strict=True))
    ]


def exchange_input(models: list[str], groups: dict[str, list[RolloutGroup]],
                   stored: dict[str, np.ndarray] | None = None) -> ExchangeInput:
    """[M, P, n] rewards of the live models, then one row per stored donor (NaN: no group)."""
    prompt_ids = [g.prompt_id for g in groups[models[0]]]
    rows = [np.stack([g.rewards for g in groups[m]]) for m in models]
    names = list(models)
    for name, rewards in (stored or {}).items():
        rows.append(rewards)
        names.append(name)
    live = np.array([True] * len(models) + [False] * len(stored or {}))
    return ExchangeInput(models=names, prompt_ids=prompt_ids, rewards=np.stack(rows), live=live)


@dataclass
class ReceiverPlan:
    grafts: list[Graft] = field(default_factory=list)
    graft_donors: list[str] = field(default_factory=list)
    sgt: list[SGTItem] = field(default_factory=list)
    sgt_donors: list[str] = field(default_factory=list)
    sgt_samples: list[tuple[str, int]] = field(default_factory=list)  # (prompt_id, donor sample)
    peers: list[PeerGroup] = field(default_factory=list)
    peer_donors: list[str] = field(default_factory=list)
    own_advantages: dict[str, np.ndarray] = field(default_factory=dict)  # prompt_id -> [n] (OWN routes)

    def own_groups(self, groups: list[RolloutGroup]) -> list[RolloutGroup]:
        """The receiver's own groups as it trains them: with the advantages of its OWN routes."""
        return [dataclasses.replace(g, advantages=self.own_advantages[g.prompt_id])
                if g.prompt_id in self.own_advantages else g for g in groups]


def plan_receivers(routes: list[Route], inp: ExchangeInput,
                   groups: dict[str, list[RolloutGroup]]) -> dict[str, ReceiverPlan]:
    """Turn routes into what each receiver's trainer gets."""
    plans = {name: ReceiverPlan() for name, live in zip(inp.models, inp.live, strict=True) if live}
    for r in routes:
        donor_name, receiver_name = inp.models[r.donor], inp.models[r.receiver]
        donor_group = groups[donor_name][r.prompt]
        plan = plans[receiver_name]
        if r.kind == GRAFT:
            plan.grafts.append(Graft(donor_group, list(donor_group.finished)))
            plan.graft_donors.append(donor_name)
        elif r.kind == SGT:
            for i in r.samples or ():
                finished = donor_group.finished[i] if donor_group.finished else True
                plan.sgt.append(SGTItem(donor_group.prompt, donor_group.responses[i], finished, donor_group.prompt_id))
                plan.sgt_donors.append(donor_name)
                plan.sgt_samples.append((donor_group.prompt_id, i))
        elif r.kind == PEER:
            advantages = list(r.advantages) if r.advantages is not None else list(donor_group.advantages)
            plan.peers.append(PeerGroup(donor_group, advantages, list(donor_group.finished)))
            plan.peer_donors.append(donor_name)
        elif r.kind == OWN:
            if r.donor != r.receiver or r.advantages is None:
                raise ValueError("an 'own' route re-weights the receiver's own group: donor == receiver, "
                                 "with advantages")
            plan.own_advantages[donor_group.prompt_id] = np.asarray(r.advantages, dtype=float)
        else:
            raise ValueError(f"unknown route kind {r.kind!r}")
    return plans


def compatibility_requests(inp: ExchangeInput) -> dict[int, list[tuple[int, int]]]:
    """Receiver -> the (donor, prompt) groups it must score for ``donor="most_compatible"``:
    every eligible pair of live models (docs/algorithm.md section 4: a scoring pass per donor)."""
    live = np.flatnonzero(inp.live).tolist()
    eligible = eligibility(inp.k, inp.n, receivers=live, donors=live)
    return {m: [(int(d), int(q)) for d, q in zip(*np.nonzero(eligible[:, m, :]), strict=True)]
            for m in live}


def mean_compatibility(receiver_mean_logp: np.ndarray, donor: RolloutGroup) -> float:
    """Mean gate score s (Eq. 7) of a donor group under a receiver's old weights."""
    s = compatibility_scores(receiver_mean_logp, donor.mean_logp)
    s = s[np.isfinite(s)]
    return float(s.mean()) if s.size else 0.0


def flow_matrix(routes: list[Route], num_models: int) -> np.ndarray:
    """F[donor, receiver] = number of groups moved this step (``own`` routes move nothing)."""
    flow = np.zeros((num_models, num_models), dtype=int)
    for r in routes:
        if r.kind != OWN:
            flow[r.donor, r.receiver] += 1
    return flow


def compatibility_matrix(inp: ExchangeInput, groups: dict[str, list[RolloutGroup]],
                         actors: dict[str, ModelActors]) -> np.ndarray:
    """[M donor, M receiver, P] mean s of every eligible donor group under each receiver's
    old weights (NaN where not eligible), for the ``most_compatible`` donor strategy."""
    compat = np.full((len(inp.models), len(inp.models), len(inp.prompt_ids)), np.nan)
    pending = {}
    for m, pairs in compatibility_requests(inp).items():
        if pairs:
            donors = [groups[inp.models[d]][q] for d, q in pairs]
            args = ([g.prompt for g in donors for _ in g.responses], [t for g in donors for t in g.responses],
                    [f for g in donors for f in (g.finished or [True] * g.n)])
            # every rank scores (a ZeRO-3 forward is collective); rank 0's answer is used
            pending[m] = (pairs, donors, actors[inp.models[m]].call_trainers("score_responses", *args))
    for m, (pairs, donors, refs) in pending.items():
        means = get_all(refs)[0]
        offset = 0
        for (d, q), donor in zip(pairs, donors, strict=True):
            compat[d, m, q] = mean_compatibility(means[offset:offset + donor.n], donor)
            offset += donor.n
    return compat
