"""The embedded demo: GRPO and GRAFT on a pair of tiny heterogeneous models, on CPU.

Both runs use the same config (``configs/demo_pair.yaml``), prompts, seed and steps;
only the exchange policy differs. Prints a results table and where to look in MLflow.
"""

from __future__ import annotations

import time
from pathlib import Path

from orchestrator.config import load_config
from orchestrator.controller.loop import train

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "demo_pair.yaml"


def _row(method: str, name: str, model: dict) -> str:
    final = model["final_pass@1"]
    ex = model["exchange"]
    all_fail = ex["all_fail"] / max(ex["prompts"], 1)
    rate = ex["received"] / ex["all_fail"] if ex["all_fail"] else 0.0
    sets = "  ".join(f"{final.get(s, 0.0):6.3f}" for s in sorted(final) if s != "avg")
    return (f"{method:<6} {name:<12} {sets}  {final.get('avg', 0.0):6.3f}  {all_fail:8.2f}  {rate:8.2f}")


def run_demo(steps: int | None = None, config_path: Path = DEMO_CONFIG) -> int:
    overrides = [f"run.steps={steps}"] if steps else []
    summaries = {}
    start = time.perf_counter()
    for method, policy in (("GRPO", "none"), ("GRAFT", "graft")):
        config = load_config(config_path, overrides + [f"exchange.name={policy}",
                                                        f"run.name=demo-{method.lower()}"])
        print(f"\n== {method}: {len(config.models)} models, {config.run.steps} steps, "
              f"exchange '{policy}' ==", flush=True)
        summaries[method] = train(config)
    sets = sorted(s for s in next(iter(summaries["GRPO"]["models"].values()))["final_pass@1"] if s != "avg")
    print("\npass@1 on held-out eval sets (mean over samples), all-fail rate and exchange rate over training")
    print(f"{'method':<6} {'model':<12} " + "  ".join(f"{s[:6]:>6}" for s in sets)
          + "     avg  all-fail  exchange")
    for method, summary in summaries.items():
        for name, model in summary["models"].items():
            print(_row(method, name, model))
    graft = summaries["GRAFT"]
    print("\nmean step time (GRAFT): " + ", ".join(
        f"{p} {t:.2f}s" for p, t in graft["mean_step_time"].items()))
    print(f"demo finished in {time.perf_counter() - start:.0f}s")
    print("Run folders: " + ", ".join(s["run_dir"] for s in summaries.values()))
    store = (Path(graft["run_dir"]).parent / "mlflow.db").resolve()
    dirs = [summaries[m]["run_dir"] for m in ("GRPO", "GRAFT")]
    try:  # the two runs side by side, read back from MLflow
        from dashboards.data import load_run
        from dashboards.report import render_compare, write

        out = write(render_compare([load_run(d) for d in dirs], ["GRPO", "GRAFT"]),
                    Path(graft["run_dir"]).parent / "demo-compare.html")
        print(f"GRPO vs GRAFT on the same axes (HTML): {out.resolve()}")
    except Exception as exc:  # noqa: BLE001 - a report problem must not fail the demo
        print(f"(the comparison report could not be written: {exc})")
    print(f"Per-run reports: .venv/bin/python -m dashboards report {dirs[1]}")
    default_store = Path("runs/mlflow.db").resolve() == store
    print("MLflow UI (which model fed which, live while a job runs): "
          + ("make dashboard" if default_store else f"make dashboard STORE={store}")
          + "  -> http://127.0.0.1:5000")
    return 0
