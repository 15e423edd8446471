"""The trainer's memory on SmolLM2-135M-Instruct with and without gradient checkpointing
(``models[].trainer.gradient_checkpointing``), and the host bytes the own / peer gradient split
copies per optimizer step (``models[].trainer.grad_parts``, ``workers/training/diagnostics.py``).

The model is the packaged GGUF of ``configs/real_pair_cpu.yaml`` (converted once into
``.cache/models``, docs/models.md). Each setting runs in a fresh process (``main`` starts it): a
``TorchTrainer`` (fp32, the CPU's precision) loads the model and takes one update of ``--rows``
own responses of ``--tokens`` new tokens (one prompt, one optimizer step) as a warm-up, which
allocates AdamW's state; the process's peak RSS (``VmHWM``) is then reset
(``/proc/self/clear_refs``) and a second update measured: ``peak`` is that update's peak RSS,
``update`` its rise over the RSS before it (activations, gradients' transients, logits chunks).
``heap_peak`` is the same update's peak of the C heap in use (``benchmarks.heap``: what the
tensors hold, without glibc's retained blocks and the file-mapped weights; the CPU's stand-in for
``torch.cuda.max_memory_allocated``), ``heap_update`` its rise over the heap before it.

The split's host bytes: in the plain setting's process, one more update over a mixed minibatch
(one own group and one peer group of 64 tokens, gate off) runs with ``tests.strict_devices.HostTracking``
around ``_step_with_parts`` (the norms and the split, the optimizer step's own reads left out):
the bytes that would cross from the device to the host on a GPU machine (``.cpu()``,
``.tolist()``, ``.item()`` of device tensors), next to the gradient's fp32 size.

    .venv/bin/python -m benchmarks.bench_grad_memory
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
SETTINGS = ("plain", "checkpointing")


def rss_mib(field: str) -> float:
    """This process's ``VmRSS`` or ``VmHWM`` (peak), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def mixed_batch(trainer, tokens: int):
    """One own group and one peer group (2 responses each, random tokens; the peer's as text)."""
    from benchmarks.bench_precision import own_batch
    from graftpool.contracts import PEER
    from graftpool.step_record import StepRecord

    record = own_batch(trainer, 2, 2, tokens)
    rows = [record.row(r) for r in range(len(record))]
    for row in rows:
        if row["group"] == 1:
            row.update(kind=PEER, source_model="peer", mean_logp=-1.0, finished=False,
                       response=trainer.tokenizer.decode(row["token_ids"]), token_ids=[])
    return StepRecord.from_rows(rows)


def split_bytes(trainer, tokens: int) -> dict:
    """Host bytes of the split in one mixed update (module docstring)."""
    from tests.strict_devices import HostTracking

    counted: list[int] = []
    step_with_parts, optimizer_step = trainer._step_with_parts, trainer._optimizer_step
    tracking: list[HostTracking] = []

    def untracked_step() -> float:  # clipping and AdamW's reads are the optimizer's, not the split's
        before = tracking[-1].to_host_bytes
        norm = optimizer_step()
        tracking[-1].to_host_bytes = before
        return norm

    def tracked(*args):
        with HostTracking() as mode:
            tracking.append(mode)
            out = step_with_parts(*args)
        counted.append(mode.to_host_bytes)
        return out

    trainer._step_with_parts, trainer._optimizer_step = tracked, untracked_step
    result = trainer.train(mixed_batch(trainer, tokens))
    kinds = [u.kind for u in result.minibatches]
    return {"kinds": kinds, "split_host_bytes": max(counted),
            "gradient_bytes": sum(p.numel() * 4 for p in trainer.params),
            "peer_grad_share": result.metrics["train/peer_grad_share"]}


def run_one(setting: str, rows: int, tokens: int, threads: int, mmap_threshold_mib: float = 0) -> dict:
    """One setting, in this process (a fresh one)."""
    from benchmarks.bench_precision import own_batch
    from benchmarks.heap import HeapPeak
    from orchestrator.config import load_config
    from orchestrator.models import resolve_model_path
    from workers.training.trainer import TorchTrainer

    path = resolve_model_path(load_config(ROOT / "configs" / "real_pair_cpu.yaml").models[0])
    trainer = TorchTrainer(path, lr=1e-6, minibatches=1, num_threads=threads, seed=0, precision="fp32",
                           gradient_checkpointing=setting == "checkpointing", mmap_threshold_mib=mmap_threshold_mib)
    batch = own_batch(trainer, 1, rows, tokens)
    trainer.train(batch)  # warm-up: AdamW's state
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM back to the current RSS
    before = rss_mib("VmRSS")
    start = time.perf_counter()
    with HeapPeak() as heap:
        heap_before = heap.peak_mib or 0.0
        trainer.train(batch)
    seconds = time.perf_counter() - start
    peak = rss_mib("VmHWM")
    out = {"setting": setting, "rss_before_mib": round(before), "peak_mib": round(peak),
           "update_mib": round(peak - before), "heap_before_mib": round(heap_before),
           "heap_peak_mib": round(heap.peak_mib or float("nan")),
           "heap_update_mib": round((heap.peak_mib or float("nan")) - heap_before), "seconds": round(seconds, 1)}
    if setting == "plain":
        out |= split_bytes(trainer, 64)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mmap-threshold-mib", type=float, default=0,
                        help="models[].trainer.mmap_threshold_mib for both settings (0: glibc's default)")
    parser.add_argument("--one", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.rows, args.tokens, args.threads, args.mmap_threshold_mib)))
        return
    results = []
    for setting in SETTINGS:
        cmd = [sys.executable, "-m", "benchmarks.bench_grad_memory", "--one", setting, "--rows", str(args.rows),
               "--tokens", str(args.tokens), "--threads", str(args.threads),
               "--mmap-threshold-mib", str(args.mmap_threshold_mib)]
        done = subprocess.run(cmd, cwd=ROOT, env=os.environ, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    plain, checkpointed = results
    print(f"rows {args.rows} x {args.tokens} new tokens: update's peak RSS {checkpointed['peak_mib']} vs "
          f"{plain['peak_mib']} MiB ({checkpointed['peak_mib'] / plain['peak_mib']:.0%}); the update's rise "
          f"{checkpointed['update_mib']} vs {plain['update_mib']} MiB "
          f"({checkpointed['update_mib'] / max(plain['update_mib'], 1):.0%}); peak heap in use "
          f"{checkpointed['heap_peak_mib']} vs {plain['heap_peak_mib']} MiB "
          f"({checkpointed['heap_peak_mib'] / plain['heap_peak_mib']:.0%}); split host bytes per update "
          f"{plain['split_host_bytes']} of a {plain['gradient_bytes']}-byte gradient "
          f"({plain['split_host_bytes'] / plain['gradient_bytes']:.2e})")


if __name__ == "__main__":
    main()
