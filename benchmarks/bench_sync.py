"""Weight sync, object store vs collective (``make bench-sync``): seconds and bytes per sync
from one trainer to R generation replicas, real Ray actors on this machine, a GPT-2 shaped
model of about 110 M parameters (fp32, built in code with the demo's BPE tokenizer; nothing is
downloaded). Writes ``benchmarks/results/sync.md`` and ``sync.json``.

``object_store``: rank 0's state dict is put in Ray's object store once and every replica
reads it (``ModelActors.sync_weights``). ``collective``: rank 0 broadcasts buckets over a gloo
group with the replicas (``workers/rollout/weight_sync.py``); the group is opened once, before timing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

from benchmarks.results_table import write_results
from orchestrator.cluster.actor_calls import get_all
from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.cluster.model_actors import ModelActors
from orchestrator.config import load_config
from orchestrator.models import resolve_model_path
from workers.rollout.generation import GenerationWorker
from workers.rollout.settings import GenerationSettings
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def build_model(folder: Path, layers: int, width: int, vocab: int) -> int:
    """A randomly initialised GPT-2 with the demo's BPE tokenizer; returns its parameter count."""
    demo = load_config(ROOT / "configs" / "demo_pair.yaml")
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model_path(demo.models[1])))
    config = GPT2Config(vocab_size=max(vocab, len(tokenizer)), n_embd=width, n_layer=layers, n_head=width // 64,
                        n_positions=256, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return sum(p.numel() for p in model.parameters())


def time_syncs(actors: ModelActors, repeats: int) -> list[float]:
    get_all(actors.sync_weights())  # warm-up (collective: opens the group)
    seconds = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        get_all(actors.sync_weights())
        seconds.append(time.perf_counter() - t0)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--bucket-mb", type=float, default=256.0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    import ray

    ray.init(**local_ray_init_kwargs(num_cpus=2 + args.replicas))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        params = build_model(folder, args.layers, args.width, args.vocab)
        trainer_cls, generator_cls = ray.remote(TorchTrainer), ray.remote(GenerationWorker)
        for mode in ("object_store", "collective"):
            trainer = trainer_cls.options(num_cpus=1).remote(str(folder))
            generators = [generator_cls.options(num_cpus=1).remote(GenerationSettings(path=str(folder), seed=i))
                          for i in range(args.replicas)]
            actors = ModelActors("bench", generators, [trainer], None, trainer_cls=TorchTrainer, weight_sync=mode,
                                 sync_bucket_mb=args.bucket_mb)
            seconds = time_syncs(actors, args.repeats)
            state_bytes = sum(v.numel() * v.element_size()
                              for v in actors.on_trainers(TorchTrainer.state_dict).get().values())
            rows.append({"mode": mode, "params": params, "replicas": args.replicas,
                         "median_s": statistics.median(seconds), "all_s": seconds,
                         "bytes_per_replica": state_bytes, "bucket_mb": args.bucket_mb if mode == "collective" else None})
            print(f"{mode:12s} {statistics.median(seconds):7.3f} s per sync ({args.replicas} replicas, "
                  f"{state_bytes / 2**20:.0f} MiB each)", flush=True)
            for actor in [*generators, trainer]:
                ray.kill(actor)
    ray.shutdown()

    table = write_results(args.out, "sync", rows,
                          ["mode", "params", "replicas", "MiB to each replica",
                           f"seconds per sync (median of {args.repeats})"],
                          lambda r: [r["mode"], f"{r['params'] / 1e6:.0f} M", str(r["replicas"]),
                                     f"{r['bytes_per_replica'] / 2**20:.0f}", f"{r['median_s']:.3f}"])
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
