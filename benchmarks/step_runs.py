"""The runs of the step benchmark (``make bench-step``, :mod:`benchmarks.bench_step`): one
side (TRL's GRPOTrainer or GraftPool) at one numerics, on one model, for one length of work.

A run is timed step by step (median of steps 2..N) and reports the sampled completion
tokens per step, the phase split and the peak RSS (``VmHWM``) of every process it used:
TRL's one process; GraftPool's driver, generation replica, trainer and verifier actors.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parent.parent
# the Python with TRL: the benchmark environment (make bench-venv), or $GRAFTPOOL_BENCH_PYTHON (a GPU
# node whose one Python has TRL from the wheelhouse: benchmarks/gpu_node.sh)
BENCH_PY = Path(os.environ.get("GRAFTPOOL_BENCH_PYTHON") or ROOT / ".venv-bench" / "bin" / "python")
PROMPTS_PER_STEP, N, MAX_NEW_TOKENS = 16, 8, 16
ROWS_PER_STEP = PROMPTS_PER_STEP * N
PHASES = ("generate", "verify", "route", "score", "train", "sync")
Numerics = Literal["fp32", "bf16"]


@dataclass(frozen=True)
class Side:
    """One column of the comparison: a framework at one numerics setting."""

    key: str
    label: str
    framework: Literal["trl", "graftpool"]
    numerics: Numerics  # the family it is compared within (equal numerics)
    trl_flags: tuple[str, ...] = ()  # benchmarks/trl_grpo_step.py switches
    precision: str = "fp32"  # GraftPool: models[].trainer.precision
    generation_dtype: str = "float32"  # GraftPool: models[].generation.dtype (hf backend)


SIDES: tuple[Side, ...] = (
    Side("trl-fp32", "TRL fp32 (bf16=False, no checkpointing)", "trl", "fp32"),
    Side("graftpool-fp32", "GraftPool fp32", "graftpool", "fp32"),
    Side("trl-defaults", "TRL defaults (bf16=True, gradient_checkpointing=True)", "trl", "bf16",
         ("--bf16", "--gradient-checkpointing")),
    Side("trl-bf16", "TRL bf16 (bf16=True, no checkpointing)", "trl", "bf16", ("--bf16",)),
    Side("graftpool-bf16-mixed", "GraftPool bf16-mixed (generation bfloat16)", "graftpool", "bf16",
         precision="bf16-mixed", generation_dtype="bfloat16"),
)
SIDE = {side.key: side for side in SIDES}
EQUAL_NUMERICS = {"fp32": "graftpool-fp32", "bf16": "graftpool-bf16-mixed"}
"""The GraftPool side each TRL side is compared with, by numerics family."""
SWEEP_SIDES = {"fp32": ("graftpool-fp32", "trl-fp32"), "bf16": ("graftpool-bf16-mixed", "trl-bf16")}
"""(GraftPool, TRL) of the length sweep, by numerics family."""


@dataclass(frozen=True)
class Work:
    """The length of the work and how a batch is split; the same on both sides."""

    max_new_tokens: int = MAX_NEW_TOKENS
    # EOS masked out until max_new_tokens, on both sides: TRL through generation_kwargs,
    # GraftPool through model_path, which must then be a forced_length_model folder
    force_length: bool = False
    micro_batch_rows: int = ROWS_PER_STEP  # TRL: completions per forward / backward
    token_budget: int | None = None  # GraftPool: models[].trainer.max_tokens_per_micro_batch
    model_path: Path | None = None  # a folder to load instead of the size's own
    device: str = "cpu"  # cuda: both sides on the GPU (GraftPool's replica and trainer half of it each)

    def __post_init__(self) -> None:
        if self.force_length and self.model_path is None:
            raise ValueError("force_length needs model_path: the forced_length_model folder GraftPool samples from")


def status_mib(pid: int, key: str = "VmHWM") -> float:
    """A size field of ``/proc/<pid>/status`` in MiB: ``VmHWM`` is the peak resident set size,
    ``VmRSS`` the current one."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def actor_pids(controller) -> dict[str, int]:
    """The process id of every actor of a running controller, and of the driver."""
    import ray

    actors = {}
    for name, model in controller.actors.items():
        actors |= {f"{name}/generation{i}": a for i, a in enumerate(model.generators)}
        actors |= {f"{name}/trainer{r}": a for r, a in enumerate(model.trainers)}
    actors |= {f"verifier{i}": a for i, a in enumerate(controller.verifier.actors)}
    pids = ray.get([a.__ray_call__.remote(lambda self: os.getpid()) for a in actors.values()])
    return {"driver": os.getpid()} | dict(zip(actors, pids, strict=True))


def timed_steps(steps: int, untimed_tail: int = 0) -> slice:
    """The steps a run's figures are over, as a slice of its steps: 2..``steps - untimed_tail``
    (the first step warms up), or the one step of a one-step run."""
    if steps < 2:
        if untimed_tail:
            raise ValueError(f"untimed_tail must leave step 2 timed, but the run has {steps} step(s)")
        return slice(None)
    if not 0 <= untimed_tail <= steps - 2:
        raise ValueError(f"untimed_tail must leave step 2 timed: 0..{steps - 2} for {steps} steps, got {untimed_tail}")
    return slice(1, steps - untimed_tail)


def run_controller(config, steps: int, untimed_tail: int = 0) -> dict[str, Any]:
    """Start a controller, time ``steps`` steps (wall and the machine's busy CPU seconds), read
    the actors' peak RSS, close it. The figures are over steps 2..``steps - untimed_tail``
    (``untimed_tail`` 1: the run's last step is left out, which under ``run.async: one_step``
    samples nothing ahead and so is not a whole step).

    ``rss_after_start_mib`` is each process's resident size once the models are loaded and
    before the first step (the base the sweep's memory bound starts from)."""
    from benchmarks.cpu import busy_cpu_seconds
    from orchestrator.controller.loop import Controller

    later = timed_steps(steps, untimed_tail)
    controller = Controller(config)
    controller.start()
    seconds, busy = [], []
    try:
        pids = actor_pids(controller)
        at_start = {name: status_mib(pid, "VmRSS") for name, pid in pids.items()}
        for step in range(1, steps + 1):
            start, busy_start = time.perf_counter(), busy_cpu_seconds()
            controller.step(step)
            seconds.append(time.perf_counter() - start)
            busy.append(busy_cpu_seconds() - busy_start)
            print(f"  step {step}: {seconds[-1]:.3f} s", flush=True)
        peaks = {name: status_mib(pid) for name, pid in pids.items()}
    finally:
        controller.close("FINISHED")
    history = controller.state.history[later]
    tokens = [sum(m["train/response_length"] * config.algorithm.prompt_batch * config.algorithm.n
                  for m in h["models"].values()) for h in history]
    return {
        "steps": [{"step": i + 1, "seconds": s, **controller.state.history[i]["timings"]} for i, s in enumerate(seconds)],
        "median_s": statistics.median(seconds[later]),
        # the machine's busy CPU seconds (all cores) per step: the work a step costs, whoever did it
        "busy_cpu_s": statistics.median(busy[later]),
        "phases": {p: statistics.median(h["timings"][p] for h in history) for p in PHASES},
        "completion_tokens": statistics.median(tokens),
        "grafts_per_step": statistics.mean(sum(m.get("exchange/received", 0.0) for m in h["models"].values())
                                           for h in history),
        "peak_rss_mib": peaks,
        "rss_after_start_mib": at_start,
    }


def forced_length_model(path: Path, max_new_tokens: int, prompt_tokens: int, workdir: Path) -> Path:
    """The model folder ``path`` as it is (its files linked), but for two JSON fields: its
    ``generation_config.json`` masks EOS out for the first ``max_new_tokens`` tokens
    (``min_new_tokens``; GraftPool's ``hf`` backend samples with the folder's generation
    config, TRL gets the same value through ``generation_kwargs``), and its ``config.json``
    allows ``prompt_tokens + max_new_tokens`` positions (a rotary model: no weight depends on it)."""
    out = workdir / f"{path.name}-len{max_new_tokens}"
    if out.exists():
        return out
    out.mkdir(parents=True)
    for item in path.iterdir():
        if item.name not in ("generation_config.json", "config.json"):
            (out / item.name).symlink_to(item.resolve())
    generation = json.loads((path / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps(generation | {"min_new_tokens": max_new_tokens}, indent=2))
    config = json.loads((path / "config.json").read_text())
    positions = max(config.get("max_position_embeddings", 0), prompt_tokens + max_new_tokens)
    (out / "config.json").write_text(json.dumps(config | {"max_position_embeddings": positions}, indent=2))
    return out


def problems_file(size: str, steps: int, seed: int, workdir: Path) -> Path:
    """The JSONL of the problems GraftPool trains on (TRL takes the same ones in order)."""
    from benchmarks.step_models import bench_problems

    data_file = workdir / f"problems-{size}-{steps}.jsonl"
    with data_file.open("w") as out:
        for p in bench_problems(PROMPTS_PER_STEP * steps, seed):
            out.write(json.dumps({"problem": p.prompt, "answer": p.answer}) + "\n")
    return data_file


def graftpool_grpo(size: str, side: Side, steps: int, seed: int, workdir: Path, overrides: list[str],
                   work: Work = Work(), untimed_tail: int = 0) -> dict[str, Any]:
    """GraftPool's GRPO step on the benchmark work: a real Ray controller with one model,
    exchange ``none``, ``exact`` verifier, 16 prompts x n = 8, one optimizer step per batch,
    AdamW lr 1e-6, generation 1 CPU + trainer 1 CPU (2 torch threads per actor; under
    ``run.async: one_step`` the replica 1, ``orchestrator.cluster.model_actors.threads_for``)."""
    from benchmarks.step_models import bench_model
    from orchestrator.config import load_config

    path = work.model_path or bench_model(size)
    gpu = {"num_gpus": 0.5} if work.device == "cuda" else {}
    trainer: dict[str, Any] = {"lr": 1e-6, "num_cpus": 1, "precision": side.precision, **gpu}
    if work.token_budget is not None:
        trainer["max_tokens_per_micro_batch"] = work.token_budget
    tag = f"{size}-{side.key}-{work.max_new_tokens}"
    config = load_config(data={
        "run": {"name": f"bench-step-{tag}", "steps": steps, "eval_every": 0, "seed": seed,
                "output_dir": str(workdir)},
        "models": [{"name": size, "path": str(path),
                    "generation": {"max_new_tokens": work.max_new_tokens, "temperature": 1.0, "top_p": 1.0,
                                   "num_cpus": 1, "dtype": side.generation_dtype, **gpu},
                    "trainer": trainer}],
        "data": {"train": {"source": "jsonl", "path": str(problems_file(size, steps, seed, workdir)),
                           "instruction": ""},
                 "verifier": "exact", "verifier_actors": 1},
        "algorithm": {"n": N, "prompt_batch": PROMPTS_PER_STEP, "minibatches": 1},
        "exchange": {"name": "none"},
        "tracking": {"uri": f"sqlite:///{workdir / 'mlflow.db'}"},
    }, overrides=overrides)
    print(f"{side.label}, {size}, {work.max_new_tokens} new tokens:", flush=True)
    result = run_controller(config, steps, untimed_tail)
    result["params"] = json.loads((bench_model(size) / "bench.json").read_text())["params"]
    return result


def trl_grpo(size: str, side: Side, steps: int, seed: int, workdir: Path, work: Work = Work()) -> dict[str, Any] | None:
    """TRL's GRPOTrainer on the same work, in the benchmark environment (a child process)."""
    if not BENCH_PY.exists():
        print(f"  no {BENCH_PY}: run `make bench-venv` (or set GRAFTPOOL_BENCH_PYTHON) for the TRL side", flush=True)
        return None
    out = workdir / f"trl-{size}-{side.key}-{work.max_new_tokens}.json"
    command = [str(BENCH_PY), "-m", "benchmarks.trl_grpo_step", "--size", size, "--steps", str(steps),
               "--seed", str(seed), "--json", str(out), *side.trl_flags,
               "--max-new-tokens", str(work.max_new_tokens), "--micro-batch-rows", str(work.micro_batch_rows)]
    if work.force_length:
        command += ["--min-new-tokens", str(work.max_new_tokens)]
    if work.model_path is not None:
        command += ["--model-path", str(work.model_path)]
    command += ["--device", work.device]
    print(f"{side.label}, {size}, {work.max_new_tokens} new tokens:", flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    result = json.loads(out.read_text())
    later = result["steps"][1:] or result["steps"]
    result["median_s"] = result["median_s_steps_2_to_N"] or statistics.median(s["seconds"] for s in later)
    result["completion_tokens"] = statistics.median(s["completion_tokens"] for s in later)
    result["phases"] = {k: statistics.median(s[f"{k}_s"] for s in later) for k in ("generate", "reward", "train")}
    return result


def run_side(size: str, side: Side, steps: int, seed: int, workdir: Path, overrides: list[str],
             work: Work = Work()) -> dict[str, Any] | None:
    """One side's run (None: the TRL side without its environment)."""
    if side.framework == "trl":
        return trl_grpo(size, side, steps, seed, workdir, work)
    return graftpool_grpo(size, side, steps, seed, workdir, overrides, work)


def graft_vs_grpo(steps: int, workdir: Path, overrides: list[str]) -> dict[str, Any]:
    """The demo pair's 2-model step with exchange ``graft`` against ``none`` (no evaluation)."""
    from orchestrator.config import load_config

    out = {}
    for exchange in ("none", "graft"):
        config = load_config(ROOT / "configs" / "demo_pair.yaml", [
            f"run.name=bench-step-pair-{exchange}", f"run.steps={steps}", "run.eval_every=0",
            f"run.output_dir={workdir}", f"exchange.name={exchange}", f"tracking.uri=sqlite:///{workdir / 'pair.db'}",
            *overrides])
        config.data.eval = []
        print(f"graftpool 2-model step, exchange {exchange}:", flush=True)
        out[exchange] = run_controller(config, steps)
    out["ratio"] = out["graft"]["median_s"] / out["none"]["median_s"]
    return out
