"""GPU check: a short GRAFT run of two small models sharing one CUDA GPU; prints the step time
split, generated tokens per second, exchange counts, GPU memory, the store's rows and the MLflow
runs, and says which part fell back and why.

    python -m benchmarks.gpu_check [--generation hf|vllm] [--steps 2] [--prompt-batch 128]

The two models are built in code (zoo builder: llama + char tokenizer and qwen2 + BPE, hidden
256, 64-wide heads, warm-started on the GPU), so nothing is downloaded.

- ``--generation hf`` (default; needs nothing beyond CUDA torch and the project): transformers
  ``generate`` in bf16 on the GPU. The llama model trains on DeepSpeed ZeRO-2 bf16, the qwen2
  model on the torch trainer with bf16-mixed, its weights reaching its replica by collective
  sync over NCCL. Without DeepSpeed the llama model takes the torch trainer too (said so); with
  one GPU the NCCL sync would pair two ranks on one device, which NCCL refuses ('Duplicate GPU
  detected'), so it goes through the object store (``CollectiveSync.open_group``, said so).
- ``--generation vllm``: a vLLM engine per model (sleeping between generate calls), as the
  paper's setting runs; needs the ``vllm`` extra.

Each model's replica and trainer take a quarter of a GPU each, except, where the node has two
GPUs or more, qwen2-bpe's trainer, which takes a whole GPU: Ray packs fractional shares onto a
GPU that has room, so at a quarter each all four actors share GPU 0 and the NCCL sync would turn
to the object store on any node; a whole GPU cannot share with its replica's quarter.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASKS = ["add", "sub", "mod", "linear", "digits", "count"]


def gpu_memory_mib() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()] if out.returncode == 0 else []


def plan(generation: str, gpus: int, has_deepspeed: bool, has_vllm: bool) -> tuple[dict, list[str]]:
    """The backends of each model, and a line per part that falls back (why)."""
    notes = []
    trainer_a = "deepspeed" if has_deepspeed else "torch"
    if not has_deepspeed:
        notes.append("DeepSpeed is not installed (pip install -e '.[deepspeed]'): llama-char trains on the torch "
                     "backend with bf16-mixed instead of ZeRO-2 bf16")
    if generation == "vllm" and not has_vllm:
        notes.append("vLLM is not installed (pip install -e '.[vllm]'): generation falls back to hf (transformers, bf16)")
        generation = "hf"
    sync_b = "collective"
    if gpus < 2:
        notes.append("one GPU: NCCL refuses two ranks of one group on one device ('Duplicate GPU detected'), so "
                     "qwen2-bpe's collective weight sync turns to the object store (a warning says so at its first sync)")
    # two GPUs or more: qwen2-bpe's trainer on a GPU of its own, away from its replica's quarter
    trainer_b_gpus = 1.0 if gpus >= 2 else 0.25
    return {"generation": generation, "trainer_a": trainer_a, "sync_b": sync_b, "trainer_b_gpus": trainer_b_gpus}, notes


def config_data(steps: int, prompt_batch: int, out: Path, generation: str = "vllm", trainer_a: str = "deepspeed",
                sync_b: str = "collective", trainer_b_gpus: float = 0.25) -> dict:
    def model(name: str, arch: str, tokenizer: str, seed: int, focus: list[str], trainer: str, weight_sync: str,
              trainer_gpus: float = 0.25) -> dict:
        gen = {"backend": generation, "max_new_tokens": 16, "num_gpus": 0.25, "num_cpus": 1, "weight_sync": weight_sync}
        gen |= {"vllm": {"gpu_memory_utilization": 0.2, "sleep": True}} if generation == "vllm" else {"dtype": "bfloat16"}
        train = {"backend": trainer, "lr": 1e-4, "num_gpus": trainer_gpus, "num_cpus": 1}
        train |= {"deepspeed": {"zero_stage": 2, "bf16": True}} if trainer == "deepspeed" else {"precision": "bf16-mixed"}
        return {"name": name, "generation": gen, "trainer": train,
                "builder": {"arch": arch, "tokenizer": tokenizer, "hidden_size": 256, "num_heads": 4, "num_layers": 4,
                            "seed": seed, "sft_tasks": {t: 0.4 if t in focus else 0.025 for t in TASKS}}}

    return {
        "run": {"name": f"gpu-check-{generation}", "steps": steps, "eval_every": 0, "output_dir": str(out)},
        # the second model's weights reach its replica by a collective broadcast (NCCL), the first's
        # through the object store
        "models": [model("llama-char", "llama", "char", 1, ["add", "mod"], trainer_a, "object_store"),
                   model("qwen2-bpe", "qwen2", "bpe", 2, ["sub", "digits"], "torch", sync_b, trainer_b_gpus)],
        "data": {"train": {"tasks": TASKS, "size": 4096},
                 "eval": [{"name": "add", "tasks": ["add"], "size": 32, "seed": 1}], "verifier_actors": 4},
        "algorithm": {"n": 8, "prompt_batch": prompt_batch, "minibatches": 4},
        "exchange": {"name": "graft"},
        "eval": {"samples": 2, "max_prompts": 8},
    }


def report(run_dir: Path, summary: dict, prompts: int, n: int, wall: float) -> list[str]:
    """What the run did: phases, tokens per second, exchanges, store rows, MLflow runs."""
    import pyarrow.dataset as ds

    lengths: dict[str, list[float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        metrics = json.loads(line).get("metrics", {})
        if "train/response_length" in metrics:
            lengths.setdefault(json.loads(line)["model"], []).append(metrics["train/response_length"])
    phases = summary["mean_step_time"]
    out = [f"{summary['steps']} steps in {wall:.1f} s (start-up included); mean step (s): "
           + ", ".join(f"{k} {v:.2f}" for k, v in phases.items())]
    for name, values in lengths.items():
        mean = sum(values) / len(values)
        out.append(f"{name}: {mean * n * prompts / max(phases['generate'], 1e-9):.0f} generated tokens/s "
                   f"({prompts} prompts x n = {n}, mean response {mean:.1f} tokens; the models generate concurrently)")
    for name, model in summary["models"].items():
        out.append(f"{name}: exchange {model['exchange']}")
    rows = ds.dataset(str(run_dir / "trajectories"), format="parquet").count_rows()
    mlflow = json.loads((run_dir / "mlflow.json").read_text()) if (run_dir / "mlflow.json").is_file() else {}
    out.append(f"store: {rows} rows; MLflow: run {mlflow.get('parent_run_id')} with "
               f"{len(mlflow.get('child_run_ids', {}))} model runs at {mlflow.get('tracking_uri')}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--generation", choices=["hf", "vllm"], default="hf")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompt-batch", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "runs")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check")
        return 2
    choice, notes = plan(args.generation, torch.cuda.device_count(), importlib.util.find_spec("deepspeed") is not None,
                         importlib.util.find_spec("vllm") is not None)
    print(f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}; memory used before: "
          f"{gpu_memory_mib()} MiB", flush=True)
    print("plan: " + json.dumps(choice), flush=True)
    for note in notes:
        print(f"fallback: {note}", flush=True)
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    config = load_config(data=config_data(args.steps, args.prompt_batch, args.out, **choice))
    start = time.perf_counter()
    try:
        summary = train(config)
    except Exception as exc:  # noqa: BLE001 - the check reports what failed (the run's errors name the stage)
        print(f"gpu_check: FAILED: {type(exc).__name__}: {str(exc).strip()[:2000]}")
        return 1
    wall = time.perf_counter() - start
    for line in report(args.out / config.run.name, summary, config.algorithm.prompt_batch, config.algorithm.n, wall):
        print(line)
    print(f"GPU memory used after: {gpu_memory_mib()} MiB (the actors held their own; they have ended)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
