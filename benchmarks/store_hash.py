"""The demo's stores as hashes, to hold a refactor to "byte-identical" (issue #54): the demo pair
(``configs/demo_pair.yaml``) with ``exchange.name`` ``none`` and ``graft``, as ``make demo`` runs
them, then a sha256 per file of each run's trajectory store, eval files and plots, written to
``<out>.sha``. Run it from two checkouts (e.g. two ``git worktree``s) and compare the files:

    .venv/bin/python -m benchmarks.store_hash --out /tmp/before    # in the old checkout
    .venv/bin/python -m benchmarks.store_hash --out /tmp/after     # in the new one
    diff /tmp/before.sha /tmp/after.sha
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

POLICIES = ("none", "graft")
HASHED = ("trajectories", "evals", "plots")


def store_hashes(out: Path) -> list[str]:
    """``<sha256>  <policy>/<folder>/<file>`` for every file the runs under ``out`` wrote in
    :data:`HASHED`, sorted by path."""
    files = sorted(p for policy in POLICIES for folder in HASHED for p in (out / policy / folder).rglob("*")
                   if p.is_file())
    return [f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(out).as_posix()}" for p in files]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the runs' folder; the hashes go to <out>.sha")
    args = parser.parse_args(argv)
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train
    from orchestrator.demos.demo import DEMO_CONFIG

    for policy in POLICIES:
        train(load_config(DEMO_CONFIG, [f"exchange.name={policy}", f"run.output_dir={args.out}",
                                        f"run.name={policy}"]))
    lines = store_hashes(args.out)
    Path(f"{args.out}.sha").write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} files hashed: {args.out}.sha")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
