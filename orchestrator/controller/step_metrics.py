"""What one step logs per model and for the pool (README, Metrics): rewards, all-fail and
exchange rates, what each trainer reported, phase timings, the flow matrix. Read from the
step's record (the model's own rollouts) and its train record (what the model trained on)."""

from __future__ import annotations

import numpy as np

from graftpool.contracts import SUCCESS_THRESHOLD
from graftpool.step_record import StepRecord
from workers.receiver.kinds import kinds_in_order
from workers.training.train_result import TrainResult
from workers.verify.verifier import is_capped, is_plugin_failure, is_timeout, is_unjudged


def group_successes(own: StepRecord) -> dict[str, int]:
    """k per prompt (successes: rewards above the threshold) of one model's rollout rows."""
    k: dict[str, int] = {}
    for prompt_id, reward in zip(own["prompt_id"], own["reward"], strict=True):
        k[prompt_id] = k.get(prompt_id, 0) + int(reward > SUCCESS_THRESHOLD)
    return k


def model_metrics(index: int, name: str, own: StepRecord, batch: StepRecord, result: TrainResult,
                  flow: np.ndarray, models: list[str], n: int,
                  timings: dict[str, float]) -> tuple[dict[str, float], dict[str, int]]:
    """One model's metrics for the step (``own``: its rollout rows; ``batch``: its rows of the
    train record), and its counts for the run's exchange totals."""
    k_of = group_successes(own)
    k = np.array(list(k_of.values()))
    all_fail = int((k == 0).sum())
    failed = {p for p, value in k_of.items() if value == 0}
    # what each row kind counts as received (a peer group: where it rescues an all-fail prompt)
    received = sum(kind.received(batch, failed) for kind in kinds_in_order())
    given = int(flow[index].sum())
    rewards = np.asarray(own["reward"], dtype=float).reshape(len(k), -1)
    metrics = {
        "train/reward_mean": float(np.mean(rewards.mean(axis=1))),
        "train/response_length": float(np.mean([len(ids) for ids in own["token_ids"]])) if len(own) else 0.0,
        # answers a reward plugin failed on (raised, timed out, returned no number in [0, 1])
        "train/plugin_failures": float(sum(is_plugin_failure(r) for r in own["reason"])),
        # responses over data.max_response_chars (judged on their tail, or refused by a plugin)
        "verify/capped": float(sum(is_capped(r) for r in own["reason"])),
        # answers whose verifier child ran out of CPU time (data.verifier_timeout_s; reward 0)
        "verify/timeouts": float(sum(is_timeout(r) for r in own["reason"])),
        # answers its verifier could not judge (a child that did not start or died twice; reward 0)
        "verify/failures": float(sum(is_unjudged(r) for r in own["reason"])),
        "exchange/all_fail_rate": all_fail / len(k),
        "exchange/mixed_rate": float(((k >= 1) & (k < n)).mean()),
        "exchange/rate": received / all_fail if all_fail else float("nan"),
        "exchange/received": float(received),
        "exchange/given": float(given),
        **{key: value for kind in kinds_in_order() for key, value in kind.step_metrics(batch).items()},
        **result.metrics,
        **{f"time/{p}": t for p, t in timings.items()},
    }
    for j, donor in enumerate(models):
        if j != index:
            metrics[f"exchange/from/{donor}"] = float(flow[j, index])
    counts = {"all_fail": all_fail, "received": received, "given": given, "prompts": len(k)}
    return metrics, counts


def pool_metrics(flow: np.ndarray, models: list[str], live: int, timings: dict[str, float]) -> dict[str, float]:
    """The job's own metrics: phase timings, the groups moved (F's total), F[donor, receiver] per live receiver."""
    pool = {f"time/{p}": t for p, t in timings.items()}
    pool["time/step"] = sum(timings.values())
    # F's total, the groups moved: not the route count, which holds HACPO's own routes (one per model
    # and prompt, donor == receiver: they move nothing and are not in F)
    pool["exchange/routes"] = float(flow.sum())
    for d, donor in enumerate(models):
        for r, receiver in enumerate(models):
            if d != r and r < live:
                pool[f"exchange/flow/{donor}/{receiver}"] = float(flow[d, r])
    return pool
