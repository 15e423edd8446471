"""LoRA against full training on SmolLM2-135M-Instruct (``models[].lora``,
``workers/lora.py``): bytes per weight sync and the trainer's peak RSS, with and
without adapters.

The model is the packaged GGUF of ``configs/real_pair_cpu.yaml`` (converted once into
``.cache/models``, docs/models.md). Each setting runs in a fresh process (peak RSS is the
process's ``VmHWM``): a ``TorchTrainer`` (fp32, the CPU's precision) loads the model, takes
``--updates`` updates of a GRPO step like ``make real-demo``'s (``--prompts`` prompts x n = 4
responses of ``--tokens`` tokens, one optimizer step each), and reports the bytes one weight sync
sends (``weights_for_sync``: what the object store carries and the collective sync broadcasts to
each replica), the peak RSS after loading and after the updates, and the seconds per update.

    .venv/bin/python -m benchmarks.bench_lora
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {
    "full": None,
    "lora r=8 q,v": {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": None},  # peft's llama default
    "lora r=16 all-linear": {"r": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"},
}


def peak_rss_mib() -> float:
    """This process's peak resident set size (``VmHWM``), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_one(setting: str, prompts: int, tokens: int, updates: int, threads: int) -> dict:
    """One setting, in this process (a fresh one: ``main`` starts it)."""
    from benchmarks.bench_precision import own_batch
    from orchestrator.config import load_config
    from orchestrator.models import resolve_model_path
    from workers.training.trainer import TorchTrainer

    path = resolve_model_path(load_config(ROOT / "configs" / "real_pair_cpu.yaml").models[0])
    lora = SETTINGS[setting]
    trainer = TorchTrainer(path, lr=1e-6, minibatches=1, num_threads=threads, seed=0,
                           lora=None if lora is None else {**lora, "init_seed": 0})
    loaded = peak_rss_mib()
    batch = own_batch(trainer, prompts, 4, tokens)
    seconds = []
    for _ in range(updates):
        start = time.perf_counter()
        trainer.train(batch)
        seconds.append(time.perf_counter() - start)
    sent = trainer.weights_for_sync()
    return {
        "setting": setting,
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
        "trainable": sum(p.numel() for p in trainer.params),
        "sync_bytes": sum(v.numel() * v.element_size() for v in sent.values()),
        "sync_tensors": len(sent),
        "rss_loaded_mib": loaded,
        "rss_peak_mib": peak_rss_mib(),
        "seconds_per_update": min(seconds),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--updates", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--one", choices=list(SETTINGS), help=argparse.SUPPRESS)  # a child process's setting
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.prompts, args.tokens, args.updates, args.threads)))
        return 0
    common = ["--prompts", str(args.prompts), "--tokens", str(args.tokens), "--updates", str(args.updates),
              "--threads", str(args.threads)]
    print(f"SmolLM2-135M-Instruct, fp32 trainer, {args.prompts} prompts x 4 x {args.tokens} tokens, "
          f"{args.updates} updates, {args.threads} threads; one fresh process per setting")
    print("| setting | trainable params | bytes per sync | tensors | peak RSS loaded (MiB) | peak RSS (MiB) "
          "| s per update |\n|---|---|---|---|---|---|---|")
    for setting in args.settings:
        out = subprocess.run([sys.executable, "-m", "benchmarks.bench_lora", "--one", setting, *common],
                             capture_output=True, text=True, cwd=ROOT, env=os.environ, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {setting} | {row['trainable']:,} of {row['parameters']:,} | {row['sync_bytes']:,} | "
              f"{row['sync_tensors']} | {row['rss_loaded_mib']:.0f} | {row['rss_peak_mib']:.0f} | "
              f"{row['seconds_per_update']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
