"""A resumed job's ``summary.json`` counts the deaths its killed job survived after its last
checkpoint (issue #51's fortieth read, part c).

The killed job wrote each death to ``faults.jsonl`` (and its MLflow tag); its checkpoint holds only
the deaths before it was written. The resumed job started ``RunState.faults`` from that checkpoint,
so its ``summary.json`` (``faults``, ``restarts``) left out a death the report's "Faults" section,
read from the same ``faults.jsonl`` lines (or the tags a resume sets again from them), lists:
metrics.md and operations.md say every death is in both. Here the demo pair runs one step with a
checkpoint, a replica death survived at step 2 is on record as the killed job wrote it, and the job
is resumed to step 2."""

from __future__ import annotations

import json
import time


def test_a_resumed_jobs_summary_keeps_the_deaths_the_killed_job_survived_after_its_checkpoint(tmp_path, ray_local):
    from dashboards.data import from_run_dir
    from orchestrator.config import load_config
    from orchestrator.controller.loop import train
    from tests.shared_runs import DEMO, SHORT_PAIR

    out = tmp_path / "runs"
    base = [*SHORT_PAIR, "exchange.name=graft", f"run.output_dir={out}", "run.name=job", "run.checkpoint_every=1"]
    train(load_config(DEMO, [*base, "run.steps=1"]))
    folder = out / "job"
    # the killed job's step 2: a replica died, was recreated and the step retried; then the job was
    # stopped (ray job stop) before its step-2 checkpoint. Its two lines, as Tracker.log_fault writes them,
    # and a third cut short by the stop (the tracker drops it, with a warning, before it is read):
    death = {"step": 2, "phase": "step 2", "stage": "generate", "actor": "generation replica 0 of model llama-char",
             "kind": "generator", "action": "recreated it and retried step 2", "time": time.time()}
    with (folder / "faults.jsonl").open("a") as f:
        f.write(json.dumps(death) + "\n" + json.dumps({**death, "recovery_s": 1.5}) + "\n" + '{"step": 2, "pha')

    summary = train(load_config(DEMO, [*base, "run.steps=2", "run.resume=true"]))

    on_record = from_run_dir(folder).faults  # what the report's "Faults" lists (MLflow out of reach: these lines)
    assert [f["actor"] for f in on_record] == ["generation replica 0 of model llama-char"]
    assert summary["restarts"] == {"generation replica 0 of model llama-char": 1}
    assert summary["faults"] == on_record
    assert json.loads((folder / "summary.json").read_text())["faults"] == on_record
