"""Evaluation responses on disk, and ``python -m orchestrator eval RUN_DIR``: pass@1 of a
finished run's final models.

Every evaluation (``Controller.evaluate``) writes what it scored next to the trajectory
store: ``<run_dir>/evals/step_NNNNNN.parquet``, one row per (model, eval set, prompt,
sample) with the response, its reward and the verifier's reason, so that every logged
pass@1 can be recomputed from the responses (``tests/test_platform.py`` does). A file is
written atomically (temporary file, then rename) and replaced when the same step is
evaluated again (a retried evaluation, a resumed run), so no row is ever duplicated; a
run continuing from a checkpoint first forgets the files past it (``drop_evals_after``).
The ``eval`` command writes its responses to ``<run_dir>/eval.parquet``, beside
``eval.json``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from graftpool.step_record import StepRecord
from graftpool.tasks import Problem

EVAL_SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("model", pa.string()),
    ("eval_set", pa.string()),
    ("prompt_id", pa.string()),
    ("task", pa.string()),
    ("question", pa.string()),
    ("answer", pa.string()),  # the gold answer the response was verified against
    ("sample", pa.int64()),
    ("response", pa.string()),
    ("reward", pa.float64()),
    ("reason", pa.string()),
])
EVALS = "evals"


def eval_path(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / EVALS / f"step_{step:06d}.parquet"


def eval_rows(step: int, model: str, eval_set: str, problems: Sequence[Problem], own: StepRecord) -> list[dict]:
    """One row per sample of one model on one eval set (``own``: its rows of the evaluation's
    record, with ``reward`` and ``reason``)."""
    problem = {p.prompt_id: p for p in problems}
    return [dict(step=step, model=model, eval_set=eval_set, prompt_id=prompt_id, task=problem[prompt_id].task,
                 question=problem[prompt_id].question, answer=problem[prompt_id].answer, sample=sample, response=text,
                 reward=float(reward), reason=reason)
            for prompt_id, sample, text, reward, reason in zip(own["prompt_id"], own["sample"], own["response"],
                                                               own["reward"], own["reason"], strict=True)]


def write_eval_responses(path: Path, rows: list[dict]) -> Path:
    """Write (or replace) one evaluation's rows; atomic by rename, as the trajectory store."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")
    pq.write_table(pa.Table.from_pylist(rows, schema=EVAL_SCHEMA), tmp)
    os.replace(tmp, path)
    return path


def drop_evals_after(run_dir: Path, step: int) -> None:
    """Forget evaluation files past ``step`` (a run continuing from a checkpoint at ``step``:
    with another ``run.eval_every`` it may not evaluate those steps again) and any half-written
    file of a killed writer."""
    folder = Path(run_dir) / EVALS
    for path in folder.glob("step_*.parquet"):
        if int(path.stem.split("_")[1]) > step:
            path.unlink()
    for tmp in folder.glob("step_*.parquet.tmp"):
        tmp.unlink(missing_ok=True)


def evaluate(ctrl: Any, step: int, responses: Path | None = None) -> dict[str, dict[str, float]]:
    """pass@1 (``graftpool.contracts.pass_at_1``: the share of successes) over ``eval.samples``
    samples per prompt, per set and model of the
    controller's current weights (its replicas); every scored response goes to ``responses``
    (default ``evals/step_NNNNNN.parquet``, replaced if there), the scores to MLflow and the run's
    evaluation history. ``ctrl``: the controller (``orchestrator.controller.loop.Controller``)."""
    from graftpool.contracts import pass_at_1
    from orchestrator.controller.task_metrics import eval_task_scores
    from workers.rollout.generation import SamplingParams
    from workers.verify.verifier import is_timeout, is_unjudged

    ev = ctrl.config.eval
    scores: dict[str, dict[str, float]] = {name: {} for name in ctrl.names}
    tasks: dict[str, dict[str, float]] = {name: {} for name in ctrl.names}  # SET/TASK -> pass@1
    # answers scored 0 for no fault of theirs, which pass@1 counts as failures: its verifier could not
    # judge them (verify/failures' reasons) or ran out of time (verify/timeouts'), over every set
    unjudged = {name: {"verify/eval_failures": 0.0, "verify/eval_timeouts": 0.0} for name in ctrl.names}
    rows: list[dict] = []
    for set_name, problems in ctrl.eval_sets.items():
        problems = problems[: ev.max_prompts] if ev.max_prompts else problems
        params = {name: SamplingParams(ev.samples, ev.temperature, ev.top_p, ctrl._sampling(name).max_new_tokens)
                  for name in ctrl.names}
        record, _, _ = ctrl._rollout(problems, params, ("evaluation", "evaluation"))
        for name in ctrl.names:
            own = record.select(record.where(model=name))
            rewards = np.asarray(own["reward"], dtype=float).reshape(len(problems), ev.samples)
            scores[name][set_name] = pass_at_1(rewards)  # successes, not the mean of fractional rewards
            tasks[name].update(eval_task_scores(set_name, problems, rewards))
            rows += eval_rows(step, name, set_name, problems, own)
            unjudged[name]["verify/eval_failures"] += sum(is_unjudged(r) for r in own["reason"])
            unjudged[name]["verify/eval_timeouts"] += sum(is_timeout(r) for r in own["reason"])
    ctrl.mirror(write_eval_responses(responses or eval_path(ctrl.run_dir, step), rows))
    for name in ctrl.names:
        if scores[name]:
            scores[name]["avg"] = float(np.mean(list(scores[name].values())))
        ctrl.tracker.log(step, {**{f"eval/{s}/pass_at_1": v for s, v in {**scores[name], **tasks[name]}.items()},
                                **unjudged[name]}, model=name)
    ctrl.state.eval_history.append({"step": step, "scores": scores, "tasks": tasks})
    return scores
