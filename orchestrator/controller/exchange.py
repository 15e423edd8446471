"""Glue between rollouts and the exchange policy: groups in, per-receiver batches out.

Pure Python/NumPy: the controller calls it between the verify and train phases.
"""

from __future__ import annotations

import numpy as np
import torch

from graftpool.contracts import OWN, ExchangeInput, RolloutGroup, Route
from graftpool.step_batch import StepBatch
from graftpool.tasks import Problem
from orchestrator.cluster.model_actors import ModelActors, get_all
from policies.pool import eligibility
from workers.receiver.kinds import ROW_KINDS
from workers.receiver.objective import grpo_advantages
from workers.receiver.peer_transfer import compatibility_scores
from workers.rollout.generation import Completion
from workers.training.sampling_logprobs import generation_means


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



def source_logprobs(groups: dict[str, list[RolloutGroup]], actors: dict[str, ModelActors], recompute: bool) -> None:
    """Each own response's mean log-likelihood under pi_old (the gate's source side, Eq. 6), set
    on its group: with ``recompute`` the trainers' pre-update forward pass (``prepare``, which
    also keeps the per-token values as the ratio's denominator), else the generation log-probs
    (``workers.training.sampling_logprobs``: an exactly on-policy update needs no extra pass)."""
    if not recompute:
        for group in (g for model_groups in groups.values() for g in model_groups):
            group.mean_logp = generation_means(group.gen_logprobs)
        return
    prepare = {name: actors[name].call_trainers("prepare", model_groups) for name, model_groups in groups.items()}
    for name, model_groups in groups.items():
        for group, mean_logp in zip(model_groups, get_all(prepare[name])[0], strict=True):
            group.mean_logp = mean_logp

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


def plan_receivers(routes: list[Route], inp: ExchangeInput,
                   groups: dict[str, list[RolloutGroup]]) -> dict[str, StepBatch]:
    """Each live receiver's :class:`StepBatch`: its own groups, then what each route gives it,
    in route order (the route kind's ``plan``, ``workers.receiver.kinds``)."""
    batches = {}
    for name, live in zip(inp.models, inp.live, strict=True):
        if live:
            batches[name] = StepBatch(name)
            for group in groups[name]:
                batches[name].add_group(OWN, group)
    for r in routes:
        donor = inp.models[r.donor]
        ROW_KINDS.get(r.kind).plan(batches[inp.models[r.receiver]], r, groups[donor][r.prompt], donor)
    return batches


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
