"""What ``make bench-learning`` reports of each run: step means of the row metrics, the eval
curves, each model's weak tasks and the train-pool recovery (``benchmarks/learning_tables.py``
builds the report; ``benchmarks/premise_check.py`` checks the regime before any exchange row)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROW_METRICS = {  # report column -> metrics.jsonl key, averaged over the run's steps
    "all_fail": "exchange/all_fail_rate",
    "exchange_rate": "exchange/rate",
    "admit_pos": "gate/admission_rate_pos",
    "admit_neg": "gate/admission_rate_neg",
    "peer_clip": "train/peer_clip_frac",
    "peer_push": "exchange/peer_push_ratio",
    "peer_grad": "train/peer_grad_share",
    "peer_only_updates": "train/updates_peer",
    "updates": "train/updates",
}


def run_means(run_dir: Path, model: str) -> dict[str, float]:
    """The ROW_METRICS of one model in one run folder, each the mean over steps (NaN: never logged)."""
    values: dict[str, list[float]] = {k: [] for k in ROW_METRICS}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        if record.get("model") != model or "metrics" not in record:
            continue
        for column, key in ROW_METRICS.items():
            value = record["metrics"].get(key)
            if value is not None and np.isfinite(value):
                values[column].append(float(value))
    return {k: float(np.mean(v)) if v else float("nan") for k, v in values.items()}


def eval_curves(run_dir: Path, model: str) -> dict[str, list[tuple[int, float]]]:
    """Each eval set's pass@1 of one model over the run's evaluations (step 0 included when the
    run evaluated its starting models), from ``metrics.jsonl``: set -> [(step, pass@1)]."""
    curves: dict[str, dict[int, float]] = {}
    path = run_dir / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        record = json.loads(line)
        if record.get("model") != model:
            continue
        for key, value in record.get("metrics", {}).items():
            if key.startswith("eval/") and key.endswith("/pass_at_1"):
                curves.setdefault(key[len("eval/"):-len("/pass_at_1")], {})[int(record["step"])] = float(value)
    return {name: sorted(points.items()) for name, points in curves.items()}


def weak_tasks(run_dir: Path) -> dict[str, list[str]]:
    """Each model's weak tasks: the ones its warm start slips on (``builder.sft_slips``)."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {m["name"]: sorted((m.get("builder") or {}).get("sft_slips") or {}) for m in config["models"]}


def first_seen_all_fail(run_dir: Path, model: str) -> list[str]:
    """Prompt ids that were all-fail for ``model`` the first time it saw them (its own rows)."""
    import pyarrow.dataset as ds

    table = ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table(
        columns=["step", "model", "prompt_id", "kind", "reward"]).to_pylist()
    first: dict[str, int] = {}
    successes: dict[tuple[str, int], float] = {}
    for row in table:
        if row["model"] != model or row["kind"] != "own":
            continue
        first[row["prompt_id"]] = min(first.get(row["prompt_id"], row["step"]), row["step"])
        key = (row["prompt_id"], row["step"])
        successes[key] = successes.get(key, 0.0) + row["reward"]
    return sorted(p for p, step in first.items() if successes[(p, step)] == 0)


def train_pool_recovery(run_dir: Path, model: str, samples: int = 8, seed: int = 0,
                        max_prompts: int = 128) -> dict[str, float]:
    """Of the prompts that were all-fail for ``model`` the first time it saw them, the fraction
    its final weights solve at least once in ``samples`` draws (pass@8 > 0), at the run's
    sampling temperature, scored by the run's verifier; at most ``max_prompts`` of them (a
    seeded draw). Generation runs in this process; the result is cached in the run folder."""
    cache = run_dir / f"recovery-{model}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (run_dir / "final" / model).is_dir():  # a results copy keeps no weights: not measured
        return {"recovery": float("nan"), "first_all_fail": float("nan")}
    import torch

    from orchestrator.config import load_config
    from orchestrator.controller.prompts import load_data, verifier_query
    from workers.rollout.generation import HFGeneration, SamplingParams
    from workers.verify.verifier import make_verifier, verify_many

    first_failed = first_seen_all_fail(run_dir, model)
    if not first_failed:
        return {"recovery": float("nan"), "first_all_fail": 0.0}
    failed = first_failed
    if len(failed) > max_prompts:
        failed = sorted(np.random.default_rng(seed).choice(failed, max_prompts, replace=False).tolist())
    config = load_config(run_dir / "config.yaml")
    problems = [p for p in load_data(config.data.train, [], config.run.seed)[0] if p.prompt_id in set(failed)]
    gen = config.models[[m.name for m in config.models].index(model)].generation
    torch.manual_seed(seed)
    completions = HFGeneration(run_dir / "final" / model).generate(
        [p.prompt for p in problems], SamplingParams(samples, gen.temperature, gen.top_p, gen.max_new_tokens))
    verifier = make_verifier(config.data.verifier)
    solved = sum(any(v.reward > 0 for v in verify_many(verifier, [verifier_query(p, text) for text in c.responses]))
                 for p, c in zip(problems, completions, strict=True))  # with question and metadata (plugins, reasoning-gym)
    result = {"recovery": solved / len(problems), "first_all_fail": float(len(first_failed)),
              "checked": float(len(problems))}
    cache.write_text(json.dumps(result))
    return result
