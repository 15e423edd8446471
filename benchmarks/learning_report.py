"""What ``make bench-learning`` reports of each run: step means of the row metrics, the eval
curves, each model's weak tasks and the train-pool recovery (``benchmarks/learning_tables.py``
builds the report; ``benchmarks/premise_check.py`` checks the regime before any exchange row)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.gate_histograms import store_histograms

ROW_METRICS = {  # report column -> metrics.jsonl key, averaged over the run's steps
    "all_fail": "exchange/all_fail_rate",
    "exchange_rate": "exchange/rate",
    "admit_pos": "gate/admission_rate_pos",
    "admit_neg": "gate/admission_rate_neg",
    "peer_clip": "train/peer_clip_frac",
    "peer_push": "exchange/peer_push_ratio",
    "peer_grad": "train/peer_grad_share",
    "peer_only_updates": "train/updates_peer",
    "own_only_updates": "train/updates_own",
    "mixed_updates": "train/updates_mixed",
    "updates": "train/updates",
}


DIGEST = "run_digest.json"
"""What the report reads of a run's ``metrics.jsonl``, ``flow_matrix.json`` and trajectory store,
kept per run (a results copy keeps it instead of those files): per model, each eval set's pass@1
curve and the :data:`ROW_METRICS` step means; the flow matrix's mean over steps; ``gate_s``, the
histograms of the gate's ln s per receiver, task and donor correctness
(``benchmarks/gate_histograms.py``; absent in digests made before them, or of runs with no store)."""


def _from_metrics(run_dir: Path) -> dict:
    """The digest's per-model part, read from ``metrics.jsonl``."""
    values: dict[str, dict[str, list[float]]] = {}
    curves: dict[str, dict[str, dict[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        model = record.get("model")
        if model is None or "metrics" not in record:
            continue
        for column, key in ROW_METRICS.items():
            value = record["metrics"].get(key)
            if value is not None and np.isfinite(value):
                values.setdefault(model, {}).setdefault(column, []).append(float(value))
        for key, value in record["metrics"].items():
            if key.startswith("eval/") and key.endswith("/pass_at_1"):
                name = key[len("eval/"):-len("/pass_at_1")]
                curves.setdefault(model, {}).setdefault(name, {})[int(record["step"])] = float(value)
    models = sorted(set(values) | set(curves))
    return {m: {"row_means": {k: float(np.mean(v)) for k, v in values.get(m, {}).items()},
                "eval_curves": {name: sorted(points.items()) for name, points in curves.get(m, {}).items()}}
            for m in models}


def run_digest(run_dir: Path) -> dict:
    """The run's :data:`DIGEST`, made from its raw files the first time and cached; {} for a
    folder with neither."""
    cache = run_dir / DIGEST
    if cache.is_file():
        return json.loads(cache.read_text())
    if not (run_dir / "metrics.jsonl").is_file():
        return {}
    digest: dict = {"models": _from_metrics(run_dir)}
    flow = run_dir / "flow_matrix.json"
    steps = json.loads(flow.read_text())["steps"] if flow.is_file() else []
    if steps:
        digest["flow"] = {"donors": steps[0]["donors"],
                          "mean": np.mean([np.asarray(s["F"], dtype=float) for s in steps], axis=0).tolist()}
    histograms = store_histograms(run_dir)
    if histograms is not None:
        digest["gate_s"] = histograms
    cache.write_text(json.dumps(digest))
    return digest


def run_means(run_dir: Path, model: str) -> dict[str, float]:
    """The ROW_METRICS of one model in one run folder, each the mean over steps (NaN: never logged)."""
    means = run_digest(run_dir).get("models", {}).get(model, {}).get("row_means", {})
    return {k: float(means.get(k, float("nan"))) for k in ROW_METRICS}


def eval_curves(run_dir: Path, model: str) -> dict[str, list[tuple[int, float]]]:
    """Each eval set's pass@1 of one model over the run's evaluations (step 0 included when the
    run evaluated its starting models): set -> [(step, pass@1)]."""
    curves = run_digest(run_dir).get("models", {}).get(model, {}).get("eval_curves", {})
    return {name: [(int(step), float(value)) for step, value in points] for name, points in curves.items()}


def weak_tasks(run_dir: Path) -> dict[str, list[str]]:
    """Each model's weak tasks: the ones its warm start slips on (``builder.sft_slips``)."""
    import yaml

    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {m["name"]: sorted((m.get("builder") or {}).get("sft_slips") or {}) for m in config["models"]}


def first_seen_all_fail(run_dir: Path, model: str) -> list[str]:
    """Prompt ids that were all-fail for ``model`` the first time it saw them (its own rows): no
    sample a success, reward above ``graftpool.contracts.SUCCESS_THRESHOLD`` (the exchange's rule;
    a reward plugin's or reasoning-gym's partial reward for a wrong answer is still a failure)."""
    import pyarrow.dataset as ds

    from graftpool.contracts import SUCCESS_THRESHOLD

    table = ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table(
        columns=["step", "model", "prompt_id", "kind", "reward"]).to_pylist()
    first: dict[str, int] = {}
    successes: dict[tuple[str, int], int] = {}
    for row in table:
        if row["model"] != model or row["kind"] != "own":
            continue
        first[row["prompt_id"]] = min(first.get(row["prompt_id"], row["step"]), row["step"])
        key = (row["prompt_id"], row["step"])
        successes[key] = successes.get(key, 0) + int(row["reward"] > SUCCESS_THRESHOLD)
    return sorted(p for p, step in first.items() if successes[(p, step)] == 0)


def train_pool_recovery(run_dir: Path, model: str, samples: int = 8, seed: int = 0,
                        max_prompts: int = 128) -> dict[str, float]:
    """Of the prompts that were all-fail for ``model`` the first time it saw them, the fraction
    its final weights solve at least once in ``samples`` draws (pass@8 > 0: a success, reward
    above 0.5, as :func:`first_seen_all_fail` counts them), at the run's sampling temperature, scored by the run's verifier; at most ``max_prompts`` of them (a
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
    config = load_config(run_dir / "config.yaml", trains=False)  # its final models sampled, no trainer
    problems = [p for p in load_data(config.data.train, [], config.run.seed)[0] if p.prompt_id in set(failed)]
    spec = config.models[[m.name for m in config.models].index(model)]
    gen = spec.generation
    torch.manual_seed(seed)
    # prompts rendered (or not) as the run's rollouts rendered them: models[].chat_template, pad_token
    completions = HFGeneration(run_dir / "final" / model, trust_remote_code=spec.trust_remote_code,
                               chat_template=spec.chat_template, pad_token=spec.pad_token).generate(
        [p.prompt for p in problems], SamplingParams(samples, gen.temperature, gen.top_p, gen.max_new_tokens))
    verifier = make_verifier(config.data.verifier, **config.verifier_params)
    solved = sum(any(v.correct for v in verify_many(verifier, [verifier_query(p, text) for text in c.responses]))
                 for p, c in zip(problems, completions, strict=True))  # with question and metadata (plugins, reasoning-gym)
    result = {"recovery": solved / len(problems), "first_all_fail": float(len(first_failed)),
              "checked": float(len(problems))}
    cache.write_text(json.dumps(result))
    return result
