"""``make soak``: the demo pair for 200 steps, every actor's memory sampled at every step.

A long run's memory must stay flat: a trainer or replica that keeps a little of every step
(a list of per-step metrics, a cache keyed by step, glibc arenas that grow) dies after days
where a short test never sees it. For each mode (``run.async: off`` and ``one_step``) the demo
pair (``configs/demo_pair.yaml``, paper GRAFT) runs ``--steps`` steps through
:meth:`Controller.run` (evaluations every ``--eval-every`` steps, a checkpoint every
``--checkpoint-every``, the export at the end), and after each step every process of the run
(the driver, each generation replica, trainer rank and verifier) has its resident set
(``VmRSS``) and peak (``VmHWM``) read from ``/proc``. A process started again after a death
starts a new series (its pid changes).

Reported per process and mode: RSS at the first sampled step and at the end, the peak, and the
slope of RSS over steps ``--slope-from`` .. the end (least squares, MiB per step; the target is
under 1 MiB a step). At the end the run is checked: the trajectory store holds every step's
rows, every checkpoint the schedule asks for is complete. Written: ``soak.json`` and
``soak.png`` (RSS over steps, one panel per mode) in ``--out``.

    .venv/bin/python -m benchmarks.soak [--steps 200] [--modes off one_step]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
TARGET_MIB_PER_STEP = 1.0


def soak_controller(samples: list[dict]):
    """A Controller that samples every process's memory after each step into ``samples``."""
    from benchmarks.step_runs import actor_pids, status_mib
    from orchestrator.controller.loop import Controller

    class SoakController(Controller):
        def step(self, step: int) -> dict[str, dict[str, float]]:
            out = super().step(step)
            row: dict = {"step": step, "time": time.time(), "processes": {}}
            for role, pid in actor_pids(self).items():
                try:
                    rss, peak = status_mib(pid, "VmRSS"), status_mib(pid, "VmHWM")
                except OSError:  # the process is gone (a death between the listing and the read)
                    continue
                row["processes"][role] = {"pid": pid, "rss": rss, "peak": peak}
            samples.append(row)
            if step % 10 == 0:
                total = sum(p["rss"] for p in row["processes"].values())
                print(f"[soak] step {step}: {len(row['processes'])} processes, {total:.0f} MiB resident", flush=True)
            return out

    return SoakController


def slope(steps: list[int], values: list[float]) -> float:
    """Least-squares slope of ``values`` over ``steps`` (MiB per step); nan under 2 points."""
    if len(steps) < 2:
        return float("nan")
    return float(np.polyfit(np.asarray(steps, float), np.asarray(values, float), 1)[0])


def series(samples: list[dict]) -> dict[str, dict]:
    """Per (role, pid): the steps sampled and RSS / peak at each."""
    out: dict[str, dict] = {}
    for row in samples:
        for role, p in row["processes"].items():
            key = f"{role} (pid {p['pid']})"
            s = out.setdefault(key, {"role": role, "steps": [], "rss": [], "peak": []})
            s["steps"].append(row["step"])
            s["rss"].append(p["rss"])
            s["peak"].append(p["peak"])
    return out


def check_run(run_dir: Path, steps: int, checkpoint_every: int) -> dict:
    """The store holds rows of every step; every scheduled checkpoint is complete."""
    import pyarrow.dataset as ds

    from orchestrator.controller.checkpoint import complete_checkpoints

    table = ds.dataset(run_dir / "trajectories", format="parquet").to_table(columns=["step"])
    stored = sorted(set(table.column("step").to_pylist()))
    wanted = [s for s in range(1, steps + 1) if checkpoint_every and s % checkpoint_every == 0]
    complete = [int(p.name.split("_")[-1]) for p in complete_checkpoints(run_dir)]
    return {"store_steps": len(stored), "store_complete": stored == list(range(1, steps + 1)),
            "store_rows": table.num_rows, "checkpoints_wanted": wanted, "checkpoints_complete": complete,
            # the run keeps the latest run.keep_checkpoints; those it keeps must be the latest wanted
            "checkpoints_ok": bool(complete) and set(complete) <= set(wanted) and complete[-1] == wanted[-1]}


def soak(mode: str, args: argparse.Namespace) -> dict:
    from orchestrator.config import load_config

    samples: list[dict] = []
    overrides = [f"run.steps={args.steps}", f"run.eval_every={args.eval_every}",
                 f"run.checkpoint_every={args.checkpoint_every}", f"run.async={mode}", "exchange.name=graft",
                 f"run.name=soak-{mode.replace('_', '-')}", f"run.output_dir={args.out / 'runs'}", *args.set]
    config = load_config(DEMO, overrides)
    start = time.perf_counter()
    summary = soak_controller(samples)(config).run()
    seconds = time.perf_counter() - start
    by_process = series(samples)
    report = {}
    for key, s in by_process.items():
        tail = [(st, r) for st, r in zip(s["steps"], s["rss"], strict=True) if st >= args.slope_from]
        report[key] = {"role": s["role"], "first_step": s["steps"][0], "rss_first_mib": round(s["rss"][0], 1),
                       "rss_last_mib": round(s["rss"][-1], 1), "peak_mib": round(max(s["peak"]), 1),
                       "slope_mib_per_step": round(slope([t for t, _ in tail], [r for _, r in tail]), 4),
                       "steps_in_slope": len(tail)}
    return {"mode": mode, "seconds": round(seconds, 1), "run_dir": summary["run_dir"], "processes": report,
            "check": check_run(Path(summary["run_dir"]), args.steps, args.checkpoint_every),
            "samples": samples}


def plot(results: list[dict], path: Path, slope_from: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 4.5), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        for key, s in series(result["samples"]).items():
            ax.plot(s["steps"], s["rss"], label=f"{key}: {result['processes'][key]['slope_mib_per_step']:+.3f} MiB/step")
        ax.axvline(slope_from, color="grey", linestyle=":", linewidth=1)
        ax.set_title(f"run.async: {result['mode']} ({result['seconds']:.0f} s)")
        ax.set_xlabel("step")
        ax.set_ylabel("resident set (MiB)")
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"demo pair, every process's RSS after each step (slope over steps {slope_from}..end)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--modes", nargs="+", default=["off", "one_step"], choices=["off", "one_step"])
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--slope-from", type=int, default=50)
    parser.add_argument("--set", action="append", default=[], help="extra config override")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "soak")
    args = parser.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    if not 1 <= args.slope_from < args.steps:
        parser.error(f"--slope-from must be in [1, --steps), got {args.slope_from}")
    results = []
    for mode in args.modes:
        print(f"[soak] run.async: {mode}, {args.steps} steps", flush=True)
        results.append(soak(mode, args))
    plot(results, args.out / "soak.png", args.slope_from)
    worst = max((p["slope_mib_per_step"], f"{r['mode']}: {k}") for r in results for k, p in r["processes"].items())
    compact = [{k: v for k, v in r.items() if k != "samples"} for r in results]
    (args.out / "soak.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                                    "results": results}, indent=1) + "\n")
    print(json.dumps(compact, indent=1))
    ok = worst[0] < TARGET_MIB_PER_STEP and all(r["check"]["store_complete"] and r["check"]["checkpoints_ok"]
                                                for r in results)
    print(f"[soak] steepest slope {worst[0]:+.3f} MiB/step ({worst[1]}); target < {TARGET_MIB_PER_STEP}; "
          f"{'PASSED' if ok else 'FAILED'}: {args.out / 'soak.json'}")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
