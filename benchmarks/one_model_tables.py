"""The evaluation curves of one-member runs (:mod:`benchmarks.one_model_of_pool`) as markdown
tables, read from each run folder's ``metrics.jsonl`` (``eval/<task>/pass_at_1`` at every
evaluation), the member's two weak tasks first, as ``members_n32.md`` and ``qwen2_char_fix.md``
print them:

    python -m benchmarks.one_model_tables /work/member-runs/llama-char-n32-s2 ...

A folder is named ``<member>-n32-s<seed>``. Its seconds: from the run's start line in
``metrics.jsonl`` to its ``summary.json``'s last write. ``--members`` reads those members' curves
from runs of the whole pool instead (``bench_learning``'s ``grpo-n8-s<seed>``), one table per member
and run (the seconds are then the whole run's):

    python -m benchmarks.one_model_tables --members llama-char qwen2-char -- /work/pool-table/runs/grpo-n8-s0
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

# each member's tasks, its weak tasks (the ones it cannot learn alone) first
TASKS = {"llama-char": ["count", "digits", "linear", "add", "mod"],
         "qwen2-char": ["count", "linear", "digits", "add", "mod"],
         "gpt2-bpe-dl": ["digits", "linear", "count", "add", "mod"],
         "llama-bpe": ["digits", "linear", "count", "add", "mod"]}


def curve_table(folder: Path, member: str | None = None) -> str:
    """One member's table in a run, the run's seconds, and the highest weak-task pass@1 after step 0
    (``member`` None: the one-member run ``<member>-n32-s<seed>``)."""
    if member is None:
        member, seed = folder.name.rsplit("-n32-s", 1)
    else:
        seed = folder.name.rsplit("-s", 1)[1]
    evals: dict[int, dict[str, float]] = {}
    started = None
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "start" and started is None:
            started = record["time"]
        metrics = record.get("metrics", {})
        if "eval/avg/pass_at_1" in metrics and record.get("model", member) == member:
            evals[record["step"]] = metrics
    tasks = TASKS[member]
    seconds = (folder / "summary.json").stat().st_mtime - started if started is not None else float("nan")
    lines = [f"**{member}, seed {seed}** ({folder.name}, {seconds:.0f} s; weak tasks {tasks[0]}, {tasks[1]})", "",
             "| step | " + " | ".join(tasks) + " |", "|" + "---|" * (len(tasks) + 1)]
    lines += [f"| {step} | " + " | ".join(f"{evals[step][f'eval/{t}/pass_at_1']:.3f}" for t in tasks) + " |"
              for step in sorted(evals)]
    highest = max(evals[s][f"eval/{t}/pass_at_1"] for s in evals if s > 0 for t in tasks[:2])
    return "\n".join(lines + ["", f"highest on its weak tasks after step 0: {highest:.3f}", ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run folders named <member>-n32-s<seed>")
    parser.add_argument("--members", nargs="+", choices=sorted(TASKS), default=None,
                        help="read these members from runs of the whole pool")
    args = parser.parse_args(argv)
    for folder in args.runs:
        for member in args.members or [None]:
            print(curve_table(folder, member))


if __name__ == "__main__":
    main()
