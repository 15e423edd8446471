"""One trainer update per ``models[].trainer.precision``, timed in this process: whether bf16
pays on this machine's CPU (docs/scale.md#precision).

The work is a GRPO step's update on the benchmark models of ``benchmarks/step_models.py``
(``small``: 0.44 M parameters, ``large``: 13.7 M): ``--prompts`` prompts x n = 8 responses of
``--tokens`` tokens, one optimizer step (minibatches 1, on-policy), on ``--threads`` torch threads.
Prints the median seconds of ``--repeats`` updates after one warm-up, per precision, and the
CPU flags that decide whether bf16 matmuls have hardware support (AMX, AVX512-BF16).

    .venv/bin/python -m benchmarks.bench_precision --size small
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.cpu import cpu_bf16_flags
from benchmarks.step_models import bench_model, bench_problems
from graftpool.contracts import OWN, RolloutGroup
from graftpool.step_batch import StepBatch
from workers.training.trainer import TorchTrainer


def groups_for(trainer: TorchTrainer, prompts: int, n: int, tokens: int, seed: int = 0) -> list[RolloutGroup]:
    rng = np.random.default_rng(seed)
    vocab = trainer.model.config.vocab_size
    out = []
    for i, problem in enumerate(bench_problems(prompts, seed)):
        ids = [rng.integers(3, vocab, tokens).tolist() for _ in range(n)]
        rewards = np.array([float(j % 2) for j in range(n)])
        adv = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
        out.append(RolloutGroup("m", f"p{i}", problem.prompt, [""] * n, ids, [[0.0] * tokens] * n, rewards, 0,
                                advantages=adv, finished=[False] * n))
    return out


def time_update(path: Path, precision: str, prompts: int, tokens: int, threads: int, repeats: int) -> float:
    trainer = TorchTrainer(path, precision=precision, lr=1e-6, minibatches=1, num_threads=threads, seed=0)
    groups = groups_for(trainer, prompts, 8, tokens)
    batch = StepBatch("bench")
    for group in groups:
        batch.add_group(OWN, group)
    trainer.train(batch)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        trainer.train(batch)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "large"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    args = parser.parse_args()
    path = bench_model(args.size)
    print(f"torch {torch.__version__}; CPU bf16 flags: {cpu_bf16_flags() or 'none'}; model {args.size}; "
          f"{args.prompts} prompts x 8 x {args.tokens} tokens; {args.threads} thread(s)")
    base = None
    for precision in args.precisions.split(","):
        seconds = time_update(path, precision, args.prompts, args.tokens, args.threads, args.repeats)
        base = base or seconds
        print(f"{precision:>10}: {seconds:.3f} s per update ({seconds / base:.2f}x fp32)")


if __name__ == "__main__":
    main()
