"""Sum ``GRAFTPOOL_TEST_CPU`` lines (``tests/cpu_accounting.py``) by test module, heaviest first.

``python -m benchmarks.test_cpu FILE [--tests N]``: each module's CPU and wall seconds and its test
count; then the ``N`` tests of most CPU.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def read_lines(path: Path) -> list[dict]:
    """The file's records; a line cut short by a killed worker is left out."""
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def by_module(records: list[dict]) -> list[tuple[str, float, float, int]]:
    """(module, CPU s, wall s, tests), most CPU first."""
    cpu: dict[str, float] = defaultdict(float)
    wall: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in records:
        module = r["test"].split("::")[0]
        cpu[module] += r["cpu_s"]
        wall[module] += r["wall_s"]
        count[module] += 1
    return sorted(((m, cpu[m], wall[m], count[m]) for m in cpu), key=lambda row: -row[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--tests", type=int, default=40, help="how many single tests to list")
    args = parser.parse_args(argv)
    records = read_lines(args.file)
    rows = by_module(records)
    total_cpu, total_wall = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"{len(records)} tests: {total_cpu:.0f} CPU s, {total_wall:.0f} wall s (summed over workers)\n")
    print("| module | CPU s | wall s | tests |\n|---|---|---|---|")
    for module, cpu, wall, n in rows:
        print(f"| `{module}` | {cpu:.0f} | {wall:.0f} | {n} |")
    print("\n| test | CPU s | wall s |\n|---|---|---|")
    for r in sorted(records, key=lambda r: -r["cpu_s"])[:args.tests]:
        print(f"| `{r['test']}` | {r['cpu_s']:.0f} | {r['wall_s']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
