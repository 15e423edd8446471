"""Rows of the trajectory store for one step (``orchestrator.controller.trajectory_store`` holds
the schema): one per row of each receiver's :class:`~graftpool.step_batch.StepBatch`, joined
with the outcome columns its trainer returned. Every row kind is written the same way."""

from __future__ import annotations

from graftpool.step_batch import StepBatch
from graftpool.tasks import Problem
from workers.receiver.kinds import ROW_KINDS


def store_rows(step: int, problems: list[Problem], batch: StepBatch, outcomes: dict[str, list],
               rendered: dict[str, str]) -> list[dict]:
    """The receiver's rows, kind by kind in the kinds' order (own, graft, peer, sgt; each kind in
    batch order). ``outcomes``: the trainer's columns (``graftpool.step_batch.OUTCOME_COLUMNS``);
    ``rendered``: prompt id -> the receiver's own rendering of the prompt (what it scored and
    trained every row under). ``trained``: an optimizer update held the row with a non-zero
    weight (a HACPO peer outside [lb_m, 1] is in its update with weight 0)."""
    tasks = {p.prompt_id: p.task for p in problems}
    batch = batch.with_columns(**outcomes)
    order = sorted(range(len(batch)), key=lambda r: ROW_KINDS.get(batch["kind"][r]).order)
    rows = []
    for r in order:
        kind, update, weight = batch["kind"][r], batch["update"][r], batch["weight"][r]
        prompt_id, mean_logp = batch["prompt_id"][r], batch["mean_logp"][r]
        rows.append(dict(
            step=step, model=batch.receiver, prompt_id=prompt_id, task=tasks.get(prompt_id, ""),
            sample=batch["sample"][r], response=batch["response"][r], n_tokens=batch["n_tokens"][r],
            reward=batch["reward"][r], reason=batch["reason"][r],
            advantage=float(batch["trained_advantage"][r]), source_model=batch["source_model"][r], kind=kind,
            weight=float(weight), compat=float(batch["compat"][r]) if ROW_KINDS.get(kind).has_compat else None,
            mean_logp=mean_logp, trained=update >= 0 and weight > 0, update=update,
            policy_version=batch["policy_version"][r], question=batch["prompt"][r],
            rendered_prompt=rendered.get(prompt_id, batch["prompt"][r])))
    return rows

