"""One trainer update per ``models[].trainer.precision``, timed in this process: whether bf16
pays on this machine's CPU (docs/scale.md#precision).

The work is a GRPO step's update on the benchmark models of ``benchmarks/step_models.py``
(``small``: 0.44 M parameters, ``large``: 13.7 M): ``--prompts`` prompts x n = 8 responses of
``--tokens`` tokens, one optimizer step (minibatches 1, on-policy), on ``--threads`` torch threads.
Prints the median seconds of ``--repeats`` updates after one warm-up, per precision, and the
CPU flags that decide whether bf16 matmuls have hardware support (AMX, AVX512-BF16).
``--profile K``: then one more update per precision under ``torch.profiler``, its K ops with the
most self CPU time (where a precision's update spends its time).

    .venv/bin/python -m benchmarks.bench_precision --size small
    .venv/bin/python -m benchmarks.bench_precision --size large --threads 2 --profile 12
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
from graftpool.contracts import OWN
from graftpool.step_record import StepRecord
from workers.training.trainer import TorchTrainer


def own_batch(trainer: TorchTrainer, prompts: int, n: int, tokens: int, seed: int = 0) -> StepRecord:
    """A receiver's batch of its own rows only (``graftpool.step_record``): ``prompts`` x ``n``
    random responses of ``tokens`` tokens each, rewards alternating 0 / 1 within each group."""
    rng = np.random.default_rng(seed)
    vocab = trainer.model.config.vocab_size
    rewards = np.array([float(j % 2) for j in range(n)])
    adv = (rewards - rewards.mean()) / (rewards.std(ddof=1) + 1e-6)
    rows = [{"receiver": "bench", "kind": OWN, "group": i, "model": "bench", "source_model": "bench",
             "prompt_id": f"p{i}", "sample": j, "prompt": problem.prompt, "response": "",
             "token_ids": rng.integers(3, vocab, tokens).tolist(), "finished": False, "reward": float(rewards[j]),
             "advantage": float(adv[j]), "mean_logp": None}
            for i, problem in enumerate(bench_problems(prompts, seed)) for j in range(n)]
    return StepRecord.from_rows(rows)


def time_update(path: Path, precision: str, prompts: int, tokens: int, threads: int, repeats: int,
                profile_rows: int = 0) -> float:
    trainer = TorchTrainer(path, precision=precision, lr=1e-6, minibatches=1, num_threads=threads, seed=0)
    batch = own_batch(trainer, prompts, 8, tokens)
    trainer.train(batch)  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        trainer.train(batch)
        times.append(time.perf_counter() - start)
    if profile_rows:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            trainer.train(batch)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=profile_rows))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="small", choices=["small", "large"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--precisions", default="fp32,bf16-mixed")
    parser.add_argument("--profile", type=int, default=0, metavar="K",
                        help="profile one more update per precision; print its K costliest ops")
    args = parser.parse_args()
    path = bench_model(args.size)
    print(f"torch {torch.__version__}; CPU bf16 flags: {cpu_bf16_flags() or 'none'}; model {args.size}; "
          f"{args.prompts} prompts x 8 x {args.tokens} tokens; {args.threads} thread(s)")
    base = None
    for precision in args.precisions.split(","):
        seconds = time_update(path, precision, args.prompts, args.tokens, args.threads, args.repeats,
                              args.profile)
        base = seconds if precision == "fp32" else base
        ratio = f" ({seconds / base:.2f}x fp32)" if base else ""
        print(f"{precision:>10}: {seconds:.3f} s per update{ratio}")


if __name__ == "__main__":
    main()
