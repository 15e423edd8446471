"""Rows of the trajectory store for one step (see ``orchestrator.controller.trajectory_store`` for the schema)."""

from __future__ import annotations

from graftpool.contracts import RolloutGroup
from graftpool.tasks import Problem
from orchestrator.controller.exchange import ReceiverPlan
from workers.training.train_result import TrainResult


def _mean_logp(group: RolloutGroup, i: int) -> float | None:
    return None if group.mean_logp is None else float(group.mean_logp[i])


def own_rows(step: int, problems: list[Problem], groups: list[RolloutGroup],
             updates: dict[str, int]) -> list[dict]:
    """The receiver's own responses; ``updates`` (the trainer's ``own_update``): the optimizer
    update that trained each group, absent for a group a graft replaced."""
    rows = []
    for problem, group in zip(problems, groups, strict=True):
        for i, text in enumerate(group.responses):
            rows.append(dict(
                step=step, model=group.model, prompt_id=group.prompt_id, task=problem.task, sample=i,
                response=text, n_tokens=len(group.token_ids[i]), reward=float(group.rewards[i]),
                reason=group.reasons[i] if group.reasons else "", advantage=float(group.advantages[i]),
                source_model=group.model, kind="own", weight=1.0, compat=None,
                mean_logp=_mean_logp(group, i), trained=updates.get(group.prompt_id, -1) >= 0,
                update=updates.get(group.prompt_id, -1), policy_version=group.policy_version, question=group.prompt,
                rendered_prompt=group.rendered_prompt or group.prompt))
    return rows


def _received_rows(step: int, receiver: str, donor: str, kind: str, group: RolloutGroup, task: str,
                   advantages, weights, compat, tokens, updates, rendered: dict[str, str]) -> list[dict]:
    """The rows of one donor group a receiver took in (``graft`` or ``peer``), one per response;
    ``trained``: an optimizer update held the response (``updates[i] >= 0``, from the trainer)
    with a non-zero weight (a HACPO peer outside [lb_m, 1] is in its update with weight 0)."""
    return [dict(
        step=step, model=receiver, prompt_id=group.prompt_id, task=task, sample=i, response=text,
        n_tokens=tokens[i], reward=float(group.rewards[i]), reason=group.reasons[i] if group.reasons else "",
        advantage=float(advantages[i]), source_model=donor, kind=kind, weight=float(weights[i]),
        compat=float(compat[i]), mean_logp=_mean_logp(group, i), trained=updates[i] >= 0 and weights[i] > 0, update=updates[i],
        policy_version=group.policy_version, question=group.prompt,
        rendered_prompt=rendered.get(group.prompt_id, group.prompt))
        for i, text in enumerate(group.responses)]


def graft_rows(step: int, receiver: str, problems: list[Problem], plan: ReceiverPlan,
               result: TrainResult, rendered: dict[str, str]) -> list[dict]:
    """Grafted responses under the receiver, with the gate's ``compat`` (s) and ``weight`` (w);
    ``rendered`` maps prompt_id -> the receiver's own rendering of the prompt (what it scored
    and trained them under)."""
    tasks = {p.prompt_id: p.task for p in problems}
    rows = []
    for graft, donor, compat, weight, tokens, advantage, updates in zip(
            plan.grafts, plan.graft_donors, result.graft_compat, result.graft_weight, result.graft_tokens,
            result.graft_advantage, result.graft_update, strict=True):
        rows += _received_rows(step, receiver, donor, "graft", graft.group, tasks.get(graft.group.prompt_id, ""),
                               advantage, weight, compat, tokens, updates, rendered)
    return rows


def sgt_rows(step: int, receiver: str, problems: list[Problem], plan: ReceiverPlan, result: TrainResult,
             groups: dict[str, list[RolloutGroup]], rendered: dict[str, str]) -> list[dict]:
    tasks = {p.prompt_id: p.task for p in problems}
    rows = []
    for item, donor, (prompt_id, i), update in zip(plan.sgt, plan.sgt_donors, plan.sgt_samples, result.sgt_update,
                                                   strict=True):
        group = next(g for g in groups[donor] if g is not None and g.prompt_id == prompt_id)
        rows.append(dict(
            step=step, model=receiver, prompt_id=prompt_id, task=tasks.get(prompt_id, ""), sample=i,
            response=item.response, n_tokens=len(group.token_ids[i]) if group.token_ids else 0,
            reward=float(group.rewards[i]), reason="", advantage=0.0, source_model=donor, kind="sgt",
            weight=1.0, compat=None, mean_logp=_mean_logp(group, i), trained=update >= 0, update=update,
            policy_version=group.policy_version, question=item.prompt,
            rendered_prompt=rendered.get(prompt_id, item.prompt)))
    return rows


def peer_rows(step: int, receiver: str, problems: list[Problem], plan: ReceiverPlan,
              result: TrainResult, rendered: dict[str, str]) -> list[dict]:
    """HACPO's added peer groups: ``compat`` is the cross ratio s at the response's update,
    ``weight`` its effective weight there (s^(1+alpha) inside [lb_m, 1], else 0)."""
    tasks = {p.prompt_id: p.task for p in problems}
    rows = []
    for peer, donor, ratio, weight, tokens, updates in zip(plan.peers, plan.peer_donors, result.peer_ratio,
                                                           result.peer_weight, result.peer_tokens, result.peer_update,
                                                           strict=True):
        rows += _received_rows(step, receiver, donor, "peer", peer.group, tasks.get(peer.group.prompt_id, ""),
                               peer.advantages, weight, ratio, tokens, updates, rendered)
    return rows
