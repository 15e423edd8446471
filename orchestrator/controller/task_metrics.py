"""Per-task metrics, for runs whose prompts mix tasks (synthetic families, reasoning-gym
datasets, a file's ``task_field``): what each model earns, fails and receives per task in a
step, and pass@1 per task inside a mixed eval set. A run with one task logs none of them."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from graftpool.contracts import pass_at_1
from graftpool.step_record import StepRecord
from graftpool.tasks import Problem
from orchestrator.controller.step_metrics import group_successes
from workers.receiver.kinds import kinds_in_order

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


def metric_name(task: str) -> str:
    """A task's name as a metric path element (MLflow keys: letters, digits, ``_ - .``)."""
    return _UNSAFE.sub("_", task) or "_"


def train_task_metrics(own: StepRecord, batch: StepRecord, task_of: Mapping[str, str]) -> dict[str, float]:
    """One model's step, per task of the prompts it sampled (``own``: its rollout rows; ``batch``:
    its rows of the train record): ``train/task/T/reward_mean``, ``exchange/task/T/all_fail_rate``
    and ``exchange/task/T/received`` (what each row kind counts as received, as for
    ``exchange/received``, on T's prompts)."""
    if len(set(task_of.values())) < 2:
        return {}
    groups = own.group_rows("prompt_id")
    means = {prompt_id: float(np.mean([own["reward"][r] for r in rows])) for (prompt_id,), rows in groups.items()}
    k = group_successes(own)
    by_task: dict[str, list[str]] = {}
    for prompt_id in means:
        by_task.setdefault(task_of.get(prompt_id, ""), []).append(prompt_id)
    failed = {p for p, value in k.items() if value == 0}
    out: dict[str, float] = {}
    for task, prompts in sorted(by_task.items()):
        name = metric_name(task)
        rows = batch.select(r for r, prompt_id in enumerate(batch["prompt_id"]) if task_of.get(prompt_id, "") == task)
        out[f"train/task/{name}/reward_mean"] = float(np.mean([means[p] for p in prompts]))
        out[f"exchange/task/{name}/all_fail_rate"] = float(np.mean([k[p] == 0 for p in prompts]))
        out[f"exchange/task/{name}/received"] = float(sum(kind.received(rows, failed) for kind in kinds_in_order()))
    return out


def eval_task_scores(set_name: str, problems: Sequence[Problem], rewards: np.ndarray) -> dict[str, float]:
    """pass@1 per task of one eval set (``rewards[i, j]``: prompt i, sample j), keyed
    ``SET/TASK``; empty for a set of one task (its pass@1 is the set's)."""
    tasks = sorted({p.task for p in problems})
    if len(tasks) < 2:
        return {}
    rows = np.asarray(rewards, dtype=float)
    return {f"{set_name}/{metric_name(t)}": pass_at_1([row for p, row in zip(problems, rows, strict=True)
                                                       if p.task == t]) for t in tasks}
