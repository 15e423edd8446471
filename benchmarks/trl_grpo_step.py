"""Step speed of TRL's GRPOTrainer on CPU (or a GPU, ``--device cuda``): the TRL side of the
GRPO step-speed benchmark.

The "same work" that both sides (TRL here, GraftPool's own GRPO step elsewhere) do per
optimizer step:

* model: the randomly initialised char-level Llama of ``--size`` from
  :func:`benchmarks.step_models.bench_model` (one saved folder, loaded by both sides), fp32;
* prompts: 16 per step, the ``Problem.prompt`` strings (paper format, no chat template) of
  ``bench_problems(16 * steps, seed)`` taken in order, step k on problems[16k : 16k + 16];
* rollouts: 8 per prompt (128 completions), plain sampling (temperature 1.0, top_p 1.0,
  no top_k), at most ``--max-new-tokens`` (16) new tokens, stopping at EOS; with
  ``--min-new-tokens`` EOS is masked out until that many tokens (transformers'
  ``min_new_tokens``, through GRPOConfig's ``generation_kwargs``), so that every completion
  can be forced to the full length;
* reward: exact match, ``ExactVerifier().verify(completion, problem.answer).reward``;
* update: group advantages, token-level clipped ratio (epsilon 0.2, epsilon_high 0.28),
  token-mean ("dapo") loss, no KL term, one pass (num_iterations 1) with the whole batch of
  128 in one optimizer step (by default in one forward / backward; ``--micro-batch-rows r``
  splits it into 128 / r accumulated micro-batches of r completions, TRL's way of bounding
  activation memory, still one generation and one optimizer step per batch); AdamW (torch),
  lr 1e-6 constant, weight decay 0.01, gradient norm clipped at 1.0.

Numerics: TRL's configs default to ``bf16=True`` and ``gradient_checkpointing=True``. Here
both are off unless asked for (``--bf16``: accelerate's bf16 autocast around the model's
forward, fp32 weights and AdamW state; ``--gradient-checkpointing``: activations recomputed
in the backward); the model is loaded in fp32 either way. Other settings that TRL would change
silently are pinned: transformers' default optimizer is fused AdamW (``adamw_torch`` here,
like ours), and the dataset is not shuffled. torch keeps its default thread count.

Each optimizer step is timed from ``on_step_begin`` to ``on_step_end``. Inside it, TRL's
``_generate_and_score_completions`` (tokenise, ``generate``, decode, rewards, advantages;
with num_iterations 1 and no accumulation TRL computes no old log-probs there) is timed,
and so is the reward function: ``generate_s`` is the first minus the second, ``reward_s``
the second, and ``train_s`` the rest of the step (forward, backward, clipping, AdamW).
``hf_generate_s`` is the part of ``generate_s`` spent in ``model.generate`` alone.

Run (needs ``make bench-venv``)::

    .venv-bench/bin/python -m benchmarks.trl_grpo_step --size small --steps 9 --seed 0 \\
        --json trl-small.json [--bf16] [--gradient-checkpointing] [--max-new-tokens 256 \\
        --min-new-tokens 256 --micro-batch-rows 32 --model-path <folder>]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import transformers
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from benchmarks.step_models import bench_model, bench_problems
from workers.rollout.tokenizer import load_tokenizer
from workers.verify.verifier import ExactVerifier

PROMPTS_PER_STEP = 16
NUM_GENERATIONS = 8
MAX_COMPLETION_LENGTH = 16
ROWS_PER_STEP = PROMPTS_PER_STEP * NUM_GENERATIONS


@dataclass(frozen=True)
class Work:
    """What varies between the benchmark's TRL runs (numerics, lengths, micro-batching)."""

    bf16: bool = False
    gradient_checkpointing: bool = False
    max_new_tokens: int = MAX_COMPLETION_LENGTH
    min_new_tokens: int = 0  # > 0: EOS masked out until this many new tokens
    micro_batch_rows: int = ROWS_PER_STEP  # completions per forward / backward
    device: str = "cpu"  # cpu | cuda: where accelerate puts the model

    def __post_init__(self) -> None:
        if self.micro_batch_rows < 1 or ROWS_PER_STEP % self.micro_batch_rows:
            raise ValueError(f"micro_batch_rows must divide {ROWS_PER_STEP}, got {self.micro_batch_rows}")


@dataclass
class PhaseTimes:
    """Seconds and tokens accumulated by the timing hooks during the current step."""

    generate_and_score: float = 0.0
    hf_generate: float = 0.0
    reward: float = 0.0
    completion_tokens: int = 0
    steps: list[dict[str, Any]] = field(default_factory=list)

    def reset(self) -> None:
        self.generate_and_score = self.hf_generate = self.reward = 0.0
        self.completion_tokens = 0


TIMES = PhaseTimes()
VERIFIER = ExactVerifier()


def exact_match(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """TRL reward function: 1.0 when the completion's boxed answer equals the gold answer."""
    start = time.perf_counter()
    rewards = [VERIFIER.verify(c, a).reward for c, a in zip(completions, answer, strict=True)]
    TIMES.reward += time.perf_counter() - start
    return rewards


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with timers around rollout + scoring and around ``model.generate``."""

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        TIMES.generate_and_score += time.perf_counter() - start
        TIMES.completion_tokens += int(output["completion_mask"].sum().item())
        return output

    def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = super()._generate_single_turn(*args, **kwargs)
        TIMES.hf_generate += time.perf_counter() - start
        return result


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step and its phase split, appended to ``TIMES.steps``."""

    def __init__(self) -> None:
        self.start = 0.0
        self.faults = 0

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        TIMES.reset()
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        seconds = time.perf_counter() - self.start
        generate = TIMES.generate_and_score - TIMES.reward
        TIMES.steps.append({
            "step": state.global_step,
            "seconds": seconds,
            "generate_s": generate,
            "reward_s": TIMES.reward,
            "train_s": seconds - TIMES.generate_and_score,
            "hf_generate_s": TIMES.hf_generate,
            "completion_tokens": TIMES.completion_tokens,
            # pages read back from disk during the step: a cause of slow steps besides the CPU
            "major_page_faults": resource.getrusage(resource.RUSAGE_SELF).ru_majflt - self.faults,
        })  # fmt: skip


def make_config(output_dir: str, steps: int, seed: int, work: Work = Work()) -> GRPOConfig:
    """The GRPOConfig of the benchmark's work (see the module docstring)."""
    return GRPOConfig(
        output_dir=output_dir,
        # rollouts
        num_generations=NUM_GENERATIONS,
        max_completion_length=work.max_new_tokens,
        generation_kwargs={"min_new_tokens": work.min_new_tokens} if work.min_new_tokens else None,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        use_vllm=False,
        shuffle_dataset=False,
        # objective
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        # one generation and one optimizer step per batch of 16 prompts x 8 completions, in
        # ROWS_PER_STEP / micro_batch_rows accumulated forward / backward passes
        per_device_train_batch_size=work.micro_batch_rows,
        gradient_accumulation_steps=ROWS_PER_STEP // work.micro_batch_rows,
        steps_per_generation=ROWS_PER_STEP // work.micro_batch_rows,
        max_steps=steps,
        # optimizer
        optim="adamw_torch",
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.01,
        max_grad_norm=1.0,
        # numerics (TRL's defaults: bf16=True, gradient_checkpointing=True)
        use_cpu=work.device == "cpu",
        bf16=work.bf16,
        gradient_checkpointing=work.gradient_checkpointing,
        # nothing else in the loop
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        seed=seed,
    )


def run(size: str, steps: int, seed: int, work: Work = Work(), model_path: Path | None = None) -> dict[str, Any]:
    """Train ``steps`` GRPO steps with TRL and return the measurements (``model_path``: a
    folder to load instead of ``bench_model(size)``, e.g. the same model with a longer
    ``max_position_embeddings``)."""
    path = model_path or bench_model(size)
    problems = bench_problems(PROMPTS_PER_STEP * steps, seed)
    dataset = Dataset.from_dict({
        "prompt": [p.prompt for p in problems],
        "answer": [p.answer for p in problems],
    })  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    tokenizer = load_tokenizer(path)
    TIMES.steps.clear()
    with tempfile.TemporaryDirectory(prefix="trl-grpo-step-") as output_dir:
        trainer = TimedGRPOTrainer(
            model=model,
            reward_funcs=exact_match,
            args=make_config(output_dir, steps, seed, work),
            train_dataset=dataset,
            processing_class=tokenizer,
            callbacks=[StepTimer()],
        )
        trainer.train()
    later = [s["seconds"] for s in TIMES.steps[1:]]
    return {
        "framework": "trl",
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "size": size,
        "params": sum(p.numel() for p in model.parameters()),
        "model_path": str(path),
        "seed": seed,
        "prompts_per_step": PROMPTS_PER_STEP,
        "num_generations": NUM_GENERATIONS,
        "max_completion_length": work.max_new_tokens,
        "work": asdict(work),
        "steps": list(TIMES.steps),
        "median_s_steps_2_to_N": statistics.median(later) if later else None,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "large", "smollm2"], default="small",
                        help="the model (smollm2: give its folder with --model-path)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where TRL trains (accelerate)")
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (TRL's default; off here by default)")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute activations in the backward (TRL's default; off here by default)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_COMPLETION_LENGTH)
    parser.add_argument("--min-new-tokens", type=int, default=0, help="mask EOS out until this many new tokens")
    parser.add_argument("--micro-batch-rows", type=int, default=ROWS_PER_STEP,
                        help=f"completions per forward / backward (a divisor of {ROWS_PER_STEP})")
    parser.add_argument("--model-path", type=Path, default=None, help="load this folder instead of the size's")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    try:
        work = Work(args.bf16, args.gradient_checkpointing, args.max_new_tokens, args.min_new_tokens,
                    args.micro_batch_rows, args.device)
    except ValueError as error:
        parser.error(str(error))

    result = run(args.size, args.steps, args.seed, work, args.model_path)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    later = result["steps"][1:] or result["steps"]
    phases = ("generate_s", "reward_s", "train_s")
    split = {k: statistics.median(s[k] for s in later) for k in phases}
    tokens = statistics.median(s["completion_tokens"] for s in later)
    median = result["median_s_steps_2_to_N"]
    print(
        f"trl {result['trl_version']} size={result['size']} params={result['params']:,} "
        f"threads={result['torch_threads']} steps={len(result['steps'])}: "
        f"median step (2..N) {median if median is None else f'{median:.3f}'} s | "
        f"generate {split['generate_s']:.3f} s, reward {split['reward_s']:.4f} s, "
        f"train {split['train_s']:.3f} s | {tokens:.0f} completion tokens/step"
    )


if __name__ == "__main__":
    main()
