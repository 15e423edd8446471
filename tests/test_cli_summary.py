"""The job's last lines name its run folder so that it can be found: under `ray job submit` a
relative ``run.output_dir`` is in the job's uploaded working copy (a temporary folder of Ray's on
the head), which ``runs/<name>`` does not locate for `ray rsync-down`, `serve` or `eval`."""
from __future__ import annotations

from pathlib import Path

from orchestrator.cli import _print_summary


def test_the_last_line_names_the_run_folder_absolute(tmp_path, monkeypatch, capsys):
    working_copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    (working_copy / "runs" / "my-pair").mkdir(parents=True)
    monkeypatch.chdir(working_copy)  # where a job's driver runs
    model = {"final_pass@1": {"math500": 0.5}, "exchange": {"received": 1, "all_fail": 2, "prompts": 4, "given": 1}}
    _print_summary({"run": "my-pair", "steps": 2, "run_dir": str(Path("runs") / "my-pair"),
                    "models": {"model-a": model}, "mean_step_time": {"generate": 1.0}, "mean_step_total": 1.0})
    first = capsys.readouterr().out.strip().splitlines()[0]
    assert first == f"run my-pair: 2 steps, folder {working_copy / 'runs' / 'my-pair'}", first
