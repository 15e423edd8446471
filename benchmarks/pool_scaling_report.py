"""The N-model scaling figure and table of ``make bench-pool`` (issue #52 part 5), from its JSON.

Two panels: (left) the pool run's seconds per step by phase, stacked, against N, with the GRPO
run's step (exchange ``none``, same per-model work) as a line; (right) the exchange's own cost
(``route`` + the compatibility scoring above GRPO's ``score``) and its share of the pool's step,
with the 10% line the issue sets at N = 8. The fitted exponents b of ``a * N^b`` go in the table.

    .venv/bin/python -m benchmarks.pool_scaling_report benchmarks/results/bench_pool.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PHASE_ORDER = ("generate", "verify", "route", "score", "train", "sync")


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    sizes = [r["n_models"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    bottom = [0.0] * len(sizes)
    for phase in PHASE_ORDER:
        heights = [r["pool"]["phases"][phase] for r in results]
        left.bar(sizes, heights, bottom=bottom, width=0.6, label=f"pool: {phase}")
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    left.plot(sizes, [r["grpo"]["median_wall_s"] for r in results], "k--o", label="GRPO step (no exchange)")
    left.plot(sizes, [r["projected_one_device_per_model_s"] for r in results], "g:^",
              label="pool, projected: one device per model")
    left.set_xlabel("models in the pool (N)")
    left.set_ylabel("seconds per step (median)")
    left.set_title(f"Step by phase, {report['cpu_count']} CPU cores shared by all N")
    left.legend(fontsize=7)
    right.plot(sizes, [r["exchange_s"] for r in results], "o-", label="exchange's own cost (s)")
    right.set_xlabel("models in the pool (N)")
    right.set_ylabel("seconds per step")
    share = right.twinx()
    share.plot(sizes, [100 * r["exchange_share"] for r in results], "rs--", label="share of the pool's step (%)")
    share.axhline(10, color="r", linewidth=0.6)
    share.set_ylabel("% of the step", color="r")
    right.set_title("The exchange's cost: route + compatibility scoring")
    lines = right.get_legend_handles_labels()
    more = share.get_legend_handles_labels()
    right.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(report: dict[str, Any]) -> str:
    """One row per N (measured), then the a * N^b fits."""
    rows = ["| N | GRPO step s | pool step s | " + " | ".join(f"pool {p} s" for p in PHASE_ORDER)
            + " | exchange s | exchange share | groups moved / step | largest actor peak MiB | driver peak MiB"
            " | projected step, one device per model s |",
            "|---" * (len(PHASE_ORDER) + 9) + "|"]
    for r in report["results"]:
        pool = r["pool"]
        phases = " | ".join(f"{pool['phases'][p]:.3f}" for p in PHASE_ORDER)
        rows.append(f"| {r['n_models']} | {r['grpo']['median_wall_s']:.2f} | {pool['median_wall_s']:.2f} | {phases}"
                    f" | {r['exchange_s']:.3f} | {100 * r['exchange_share']:.1f}% | {pool['groups_moved']:.1f}"
                    f" | {pool['max_actor_peak_mib']:.0f} | {pool['peak_rss_mib'].get('driver', float('nan')):.0f}"
                    f" | {r['projected_one_device_per_model_s']:.2f} |")
    fits = ["| figure | a | b |", "|---|---|---|"]
    fits += [f"| {name} | {fit['a']:.3f} | {fit['b']:.2f} |" for name, fit in report["fits_a_N^b"].items()]
    return "\n".join(rows) + "\n\nFits of a * N^b over the sizes run (least squares in log-log):\n\n" + "\n".join(fits) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("report", type=Path, help="bench_pool.json")
    args = parser.parse_args()
    report = json.loads(args.report.read_text())
    plot(report, args.report.with_suffix(".png"))
    args.report.with_suffix(".md").write_text(markdown(report))
    print(f"written {args.report.with_suffix('.png')} and {args.report.with_suffix('.md')}")


if __name__ == "__main__":
    main()
