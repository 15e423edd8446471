"""Routing cost: ``policies.pool.route`` must stay far below 1% of a training step.

Times every donor strategy and balance mode on random success counts for pools of
2-8 models and prompt batches up to the paper's 128 (and 1024), n = 8, and prints a
table in milliseconds. Run with ``make bench``.
"""

from __future__ import annotations

import time

import numpy as np

from policies.pool import BALANCE_MODES, route


def _time(repeats: int, *args) -> float:
    """Mean milliseconds of ``route(*args)`` after one warm-up call."""
    route(*args)
    start = time.perf_counter()
    for _ in range(repeats):
        route(*args)
    return (time.perf_counter() - start) / repeats * 1000


def main() -> None:
    rng = np.random.default_rng(0)
    n = 8
    print(f"{'models':>6} {'prompts':>7} {'balance':>9} {'donor':>15} {'ms/route':>9} {'routes':>7}")
    for models, prompts in [(2, 128), (3, 128), (8, 128), (8, 1024)]:
        # a skill mix like the zoo's: ~40% all-fail, ~55% mixed
        k = np.where(rng.random((models, prompts)) < 0.4, 0, rng.integers(1, n + 1, (models, prompts)))
        compat = rng.random((models, models, prompts))
        for balance in BALANCE_MODES:
            for donor in ("most_successes", "most_compatible", "least_used", "random"):
                repeats = 20 if prompts <= 128 else 3
                ms = _time(repeats, k, n, donor, balance, compat)
                count = len(route(k, n, donor, balance, compat))
                print(f"{models:>6} {prompts:>7} {balance:>9} {donor:>15} {ms:>9.2f} {count:>7}")


if __name__ == "__main__":
    main()
