"""A job stopped during a checkpoint's upload to ``run.storage``, re-submitted with ``--resume`` on
the same head (issue #51's thirtieth read). The checkpoint is whole in the run folder, cut in
storage (its files part-way, no metadata: not a checkpoint there). The resumed job went on from
the run folder's copy and never uploaded it: storage's latest stayed the one before until the next
save (a head lost meanwhile cost the steps between them), and the cut upload was never deleted
(``run.keep_checkpoints`` counts whole ones only; a 3 B pair's checkpoint is 75.6 GB). Now the
resumed job uploads it first. A real one-model run on a ``file://`` storage; the cut upload is
what a stop leaves: some files, no ``.metadata.json``."""

from __future__ import annotations

from pathlib import Path

from orchestrator.controller.loop import Controller
from orchestrator.controller.run_storage import RunStorage
from tests.shared_runs import one_model_config

SETS = ["run.name=cut", "run.steps=2", "run.checkpoint_every=1", "run.keep_checkpoints=2", "run.eval_every=0",
        "algorithm.prompt_batch=8", "eval.max_prompts=4", "eval.samples=2", "data.verifier_actors=1",
        "tracking.views=false"]


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".metadata.json"}


def test_a_checkpoint_whose_upload_was_cut_is_uploaded_by_the_resumed_job(ray_local, tmp_path):
    uri = (tmp_path / "shared").as_uri()
    sets = [*SETS, f"run.storage={uri}"]
    Controller(one_model_config(tmp_path, "one", sets)).run()
    storage = RunStorage(uri, "cut")
    assert storage.checkpoint_names() == ["step_000001", "step_000002"]
    cut = tmp_path / "shared" / "cut" / "checkpoints" / "step_000002"
    (cut / ".metadata.json").unlink()  # the job stopped during this upload: its metadata goes last
    (cut / "controller.json").unlink()
    assert storage.checkpoint_names() == ["step_000001"]

    Controller(one_model_config(tmp_path, "one", [*sets, "run.resume=true"])).run()  # the same head
    assert storage.checkpoint_names() == ["step_000001", "step_000002"], \
        "run.storage lacks the checkpoint the resumed job went on from"
    local = tmp_path / "runs" / "cut" / "checkpoints" / "step_000002"
    assert _tree(cut) == _tree(local)


def test_the_resumed_jobs_upload_brings_the_metric_log_up_to_its_checkpoint(ray_local, tmp_path):
    """The job stopped after the local save of step 2 and before the save mirrored the records:
    storage's ``metrics.jsonl`` ends at step 1, and step 2's upload never began. The resumed job's
    upload of step 2 mirrors the records first (before: only the checkpoint went, so a head lost
    before the next save resumed from step 2 with no line of step 2 in the metric log)."""
    import json

    uri = (tmp_path / "shared").as_uri()
    sets = [*SETS, "run.name=gap", f"run.storage={uri}"]
    Controller(one_model_config(tmp_path, "one", sets)).run()
    storage = RunStorage(uri, "gap")
    log = tmp_path / "shared" / "gap" / "metrics.jsonl"
    log.write_text("".join(line + "\n" for line in log.read_text().splitlines()
                           if json.loads(line).get("step", 0) <= 1))  # what step 1's save mirrored
    storage.delete("checkpoints", "step_000002")
    assert storage.checkpoint_names() == ["step_000001"]

    resumed = Controller(one_model_config(tmp_path, "one", [*sets, "run.resume=true"]))  # the same head
    try:
        resumed.start()
    finally:
        resumed.close("KILLED")  # stopped again, before any later save: what storage holds now counts
    assert storage.checkpoint_names() == ["step_000001", "step_000002"]
    steps = {json.loads(line).get("step", 0) for line in log.read_text().splitlines()}
    assert 2 in steps, f"run.storage's metric log ends at step {max(steps)}, its latest checkpoint is step 2"
