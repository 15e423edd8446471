"""Per-task metrics, for runs whose prompts mix tasks (synthetic families, reasoning-gym
datasets, a file's ``task_field``): what each model earns, fails and receives per task in a
step, and pass@1 per task inside a mixed eval set. A run with one task logs none of them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from graftpool.contracts import RolloutGroup
from graftpool.step_batch import ROW_COLUMNS, StepBatch
from graftpool.tasks import Problem
from workers.receiver.kinds import kinds_in_order

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def metric_name(task: str) -> str:
    """A task's name as a metric path element (MLflow keys: letters, digits, ``_ - .``)."""
    return _UNSAFE.sub("_", task) or "_"


def train_task_metrics(groups: Sequence[RolloutGroup], batch: StepBatch,
                       task_of: Mapping[str, str]) -> dict[str, float]:
    """One model's step, per task of the prompts it sampled: ``train/task/T/reward_mean``,
    ``exchange/task/T/all_fail_rate`` and ``exchange/task/T/received`` (what each row kind counts
    as received, as for ``exchange/received``, on T's prompts of the step batch)."""
    if len(set(task_of.values())) < 2:
        return {}
    by_task: dict[str, list[RolloutGroup]] = {}
    for group in groups:
        by_task.setdefault(task_of.get(group.prompt_id, ""), []).append(group)
    failed = {g.prompt_id for g in groups if g.k == 0}
    out: dict[str, float] = {}
    for task, items in sorted(by_task.items()):
        name = metric_name(task)
        rows = _rows_where(batch, lambda prompt_id, task=task: task_of.get(prompt_id, "") == task)
        out[f"train/task/{name}/reward_mean"] = float(np.mean([g.rewards.mean() for g in items]))
        out[f"exchange/task/{name}/all_fail_rate"] = float(np.mean([g.k == 0 for g in items]))
        out[f"exchange/task/{name}/received"] = float(sum(kind.received(rows, failed) for kind in kinds_in_order()))
    return out


def _rows_where(batch: StepBatch, keep: Callable[[str], bool]) -> StepBatch:
    """The batch's rows whose prompt id ``keep`` accepts (group indices unchanged)."""
    kept = [r for r, prompt_id in enumerate(batch["prompt_id"]) if keep(prompt_id)]
    return StepBatch(batch.receiver, {name: [batch[name][r] for r in kept] for name in ROW_COLUMNS}, batch.groups)


def eval_task_scores(set_name: str, problems: Sequence[Problem], rewards: np.ndarray) -> dict[str, float]:
    """pass@1 per task of one eval set (``rewards[i, j]``: prompt i, sample j), keyed
    ``SET/TASK``; empty for a set of one task (its pass@1 is the set's)."""
    tasks = sorted({p.task for p in problems})
    if len(tasks) < 2:
        return {}
    per_prompt = np.asarray(rewards, dtype=float).mean(axis=1)
    return {f"{set_name}/{metric_name(t)}": float(np.mean([r for p, r in zip(problems, per_prompt, strict=True)
                                                           if p.task == t])) for t in tasks}
