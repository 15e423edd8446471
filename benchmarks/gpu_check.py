"""GPU check: a short GRAFT run with vLLM generation and DeepSpeed training on two small
models sharing one CUDA GPU; prints the step time split, generation throughput and GPU memory.

Needs a CUDA GPU and the GPU extras (``pip install -e '.[vllm,deepspeed]'`` over a CUDA
torch). The two models are built in code (zoo builder: llama + char tokenizer and qwen2 +
BPE, hidden 256, 64-wide heads, warm-started as the demo's), so nothing is downloaded.
Each model gets a quarter of the GPU for its vLLM engine and a quarter for its DeepSpeed
(ZeRO-2, bf16) rank; the engines sleep between generate calls (``vllm.sleep``). The qwen2
model's weights reach its replica by collective sync over NCCL (``weight_sync: collective``,
into vLLM's reload hook), the llama model's through the object store.

    python -m benchmarks.gpu_check [--steps 2] [--prompt-batch 128]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def gpu_memory_mib() -> list[int]:
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=False)
    return [int(x) for x in out.stdout.split()] if out.returncode == 0 else []


def config_data(steps: int, prompt_batch: int, out: Path) -> dict:
    def model(name: str, arch: str, tokenizer: str, seed: int, focus: list[str], weight_sync: str) -> dict:
        return {
            "name": name,
            "builder": {"arch": arch, "tokenizer": tokenizer, "hidden_size": 256, "num_heads": 4, "num_layers": 4,
                        "seed": seed, "sft_tasks": {t: 0.4 if t in focus else 0.025 for t in
                                                    ["add", "sub", "mod", "linear", "digits", "count"]}},
            "generation": {"backend": "vllm", "max_new_tokens": 16, "num_gpus": 0.25, "num_cpus": 1,
                           "vllm": {"gpu_memory_utilization": 0.2, "sleep": True}, "weight_sync": weight_sync},
            "trainer": {"backend": "deepspeed", "lr": 1e-4, "num_gpus": 0.25, "num_cpus": 1,
                        "deepspeed": {"zero_stage": 2, "bf16": True}},
        }

    return {
        "run": {"name": "gpu-check", "steps": steps, "eval_every": 0, "output_dir": str(out)},
        # the second model's weights reach its vLLM replica by NCCL broadcast (collective
        # weight sync into vLLM's reload hook), the first's through the object store
        "models": [model("llama-char", "llama", "char", 1, ["add", "mod"], "object_store"),
                   model("qwen2-bpe", "qwen2", "bpe", 2, ["sub", "digits"], "collective")],
        "data": {"train": {"tasks": ["add", "sub", "mod", "linear", "digits", "count"], "size": 4096},
                 "eval": [{"name": "add", "tasks": ["add"], "size": 32, "seed": 1}], "verifier_actors": 4},
        "algorithm": {"n": 8, "prompt_batch": prompt_batch, "minibatches": 4},
        "exchange": {"name": "graft"},
        "eval": {"samples": 2, "max_prompts": 8},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--prompt-batch", type=int, default=128)
    parser.add_argument("--out", type=Path, default=ROOT / "runs")
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check")
        return 2
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train

    config = load_config(data=config_data(args.steps, args.prompt_batch, args.out))
    print(f"GPU: {torch.cuda.get_device_name(0)}; memory used before: {gpu_memory_mib()} MiB", flush=True)
    start = time.perf_counter()
    summary = train(config)
    wall = time.perf_counter() - start
    run_dir = args.out / "gpu-check"
    lengths = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    tokens = {}
    for record in lengths:
        metrics = record.get("metrics", {})
        if "train/response_length" in metrics:
            tokens.setdefault(record["model"], []).append(metrics["train/response_length"])
    n, prompts = config.algorithm.n, config.algorithm.prompt_batch
    generate_s = summary["mean_step_time"]["generate"]
    print(f"{args.steps} steps in {wall:.1f} s (incl. start-up); mean step time per phase (s): "
          + ", ".join(f"{k} {v:.2f}" for k, v in summary["mean_step_time"].items()))
    for name, values in tokens.items():
        per_step = sum(values) / len(values) * n * prompts
        print(f"{name}: {per_step / generate_s:.0f} generated tokens/s ({prompts} prompts x n = {n}, "
              f"mean response {sum(values) / len(values):.1f} tokens; both models generate concurrently)")
    for name, model in summary["models"].items():
        print(f"{name}: exchange {model['exchange']}")
    print(f"GPU memory used after: {gpu_memory_mib()} MiB; peak in this process: "
          f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB (actors hold their own)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
