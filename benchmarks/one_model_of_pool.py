"""One member of a pool run alone, on exactly the curve it has in the pool's run without exchange.

In a run without exchange (``exchange.name: none``) a pool's models never interact, so model i's
part of the run is its own. The controller seeds model i's actors with ``run.seed + 7919 * i``
(``orchestrator/controller/loop.py``); this driver keeps the config's other fields, drops the
other models and shifts the one model's actor seed by ``7919 * i``, so its run equals model i's
part of the pool run (metrics and evaluations, timings aside; benchmarks/results/
learning_premise_pool/qwen2_char_fix.md checks it on 31 steps). It is how the premise check of
one member is re-run at a new setting without paying for the other members.

    python -m benchmarks.one_model_of_pool configs/learning_premise_pool.yaml qwen2-char \\
        --out /tmp/qwen --name lr125-n32-s0 --set run.seed=0 algorithm.n=32 \\
        models.qwen2-char.trainer.lr=1.25e-5

``--set`` takes the ``--set`` overrides of ``python -m orchestrator run``; a
``models.<name>.`` prefix addresses the member (it is model 0 of the one-model config). The
GRPO rows' overrides of ``bench_learning`` are applied first: ``exchange.name=none``,
``run.eval_at_start=true``, ``run.eval_every=10``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import ray

import orchestrator.controller.loop as loop
from benchmarks.bench_learning import keep_models
from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.config import load_config
from orchestrator.config.loading import _yaml

GRPO_ROW_OVERRIDES = ["exchange.name=none", "run.eval_at_start=true", "run.eval_every=10"]
SEED_STRIDE = 7919  # the controller's per-model seed stride (loop.py)


def one_model_config(pool: dict, model_name: str) -> tuple[dict, int]:
    """The pool config with ``model_name`` its only model, and that model's index in the pool."""
    alone = keep_models(pool, (model_name,), "this config")
    return alone, [m["name"] for m in pool["models"]].index(model_name)


def member_overrides(overrides: list[str], model_name: str) -> list[str]:
    """``models.<name>.field=v`` -> ``models.0.field=v`` (the member is model 0 when alone)."""
    prefix = f"models.{model_name}."
    return [("models.0." + o[len(prefix):]) if o.startswith(prefix) else o for o in overrides]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("model")
    parser.add_argument("--out", type=Path, required=True, help="run.output_dir")
    parser.add_argument("--name", required=True, help="run.name")
    parser.add_argument("--set", nargs="*", default=[], dest="overrides")
    parser.add_argument("--num-cpus", type=int, default=8, help="the local Ray instance's CPUs")
    args = parser.parse_args()

    pool = _yaml(args.config.read_text())  # the config loader's YAML (its tags too)
    alone, index = one_model_config(pool, args.model)
    overrides = GRPO_ROW_OVERRIDES + member_overrides(args.overrides, args.model) + [
        f"run.output_dir={args.out}", f"run.name={args.name}"]
    config = load_config(data=alone, overrides=overrides)

    spawn = loop.spawn_model_actors
    loop.spawn_model_actors = lambda m, path, algo, exch, seed, *a, **kw: spawn(
        m, path, algo, exch, seed + SEED_STRIDE * index, *a, **kw)
    ray.init(**local_ray_init_kwargs(num_cpus=args.num_cpus))
    start = time.monotonic()
    try:
        summary = loop.train(config)
    finally:
        ray.shutdown()
    print(json.dumps({"run": args.name, "wall_s": round(time.monotonic() - start, 1),
                      "model_index": index, "summary_keys": sorted(summary)}, indent=1))


if __name__ == "__main__":
    main()
