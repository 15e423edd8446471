"""``dashboards report`` of a resumed job that has not yet logged the steps its killed job had
reached: a real MLflow sqlite store and the tracker the controller uses (issue #51's thirty-second read).

A job killed at step 3 with its checkpoint at step 1 is resumed (``ray job stop``, then the same
``ray job submit``); MLflow keeps what the killed job sent for steps 2 and 3 (it cannot delete a
metric value). While the resumed job ran step 2 again, and for good where it ended before step 3
(``run.steps`` may be lowered on a resume), the report read from MLflow showed the killed job's
step 3 as the run's: "steps logged 1-3", its curve point, its value in every mean, total and
"final" figure. The run folder's ``metrics.jsonl`` kept it too until the resumed job's first line.
Now the tracker tags the job's run at each resume (``graftpool.resume.<ms>``: the step it went
back to), and the reports leave out the values logged before it for later steps."""

from __future__ import annotations

import json


def test_a_resumed_jobs_report_leaves_out_what_the_killed_job_logged_past_the_checkpoint(tmp_path):
    from dashboards.data import from_run_dir, load_run
    from dashboards.report import render_report
    from dashboards.tracking import Tracker

    runs = tmp_path / "runs"
    uri, folder = f"sqlite:///{runs / 'mlflow.db'}", runs / "job"
    runs.mkdir()
    killed = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a"], folder)
    for step in (1, 2, 3):
        killed.log(step, {"train/reward_mean": step / 10, "eval/avg/pass_at_1": step / 10}, model="a")
        killed.log(step, {"time/step": 1.0})
    assert killed.ok  # then killed: no finish
    pointer = json.loads((folder / "mlflow.json").read_text())
    resume = {k: pointer[k] for k in ("experiment_id", "parent_run_id", "child_run_ids")} | {"step": 1}
    resumed = Tracker(uri, "exp", "job", {"run": {"steps": 3}}, ["a"], folder, resume=resume)
    resumed.log(2, {"train/reward_mean": 0.9}, model="a")
    resumed.log(2, {"time/step": 2.0})
    assert resumed.ok  # still running: step 3 not logged again yet

    data = load_run(str(folder))
    assert data.source.startswith("MLflow")
    assert data.metric("a", "train/reward_mean") == [(1, 0.1), (2, 0.9)]  # before: (3, 0.3) too
    assert data.final("a", "eval/avg/pass_at_1") == 0.1  # before: the killed job's 0.3 at step 3
    assert data.metric("", "time/step") == [(1, 1.0), (2, 2.0)]
    assert "1-2 (2)" in render_report(data)  # "steps logged"
    local = from_run_dir(folder)
    assert local.series["a"]["train/reward_mean"] == [(1, 0.1), (2, 0.9)]
