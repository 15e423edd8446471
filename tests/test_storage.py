"""``run.storage`` (``orchestrator/controller/run_storage.py``) on a ``file://`` URI: checkpoints uploaded as
Ray Train checkpoints and pruned, the store mirrored, and a fresh run folder restored from it.
The end-to-end path (two ``ray job submit`` jobs, the second resuming from storage) is in
``tests/test_job_submit.py``."""

from __future__ import annotations

import json

from ray.train import Checkpoint

from orchestrator.controller.run_storage import RunStorage, open_storage


def _checkpoint(run_dir, step: int):
    folder = run_dir / "checkpoints" / f"step_{step:06d}"
    (folder / "llama").mkdir(parents=True)
    (folder / "llama" / "trainer_rank0.pt").write_bytes(bytes([step]) * 100)
    (folder / "controller.json").write_text(json.dumps({"step": step}))
    return folder


def test_storage_keeps_checkpoints_and_restores_a_fresh_run_folder(tmp_path):
    run_dir = tmp_path / "work" / "job"
    uri = (tmp_path / "shared").as_uri()  # file:///...: outside the run folder
    storage = open_storage(uri, run_dir, resume=False)
    (run_dir / "trajectories").mkdir(parents=True)
    (run_dir / "config.yaml").write_text("run: {name: job}\n")
    storage.mirror(run_dir / "config.yaml")
    for step in (1, 2, 3):
        path = run_dir / "trajectories" / f"step_{step:06d}.parquet"
        path.write_bytes(b"rows %d" % step)
        storage.mirror(path)
        storage.save_checkpoint(_checkpoint(run_dir, step), step, keep=2)
    assert storage.checkpoint_names() == ["step_000002", "step_000003"]
    assert not [n for n in storage.list("checkpoints") if n.startswith(".tmp-")]
    remote = Checkpoint(storage._path("checkpoints", "step_000003"), storage.fs)
    assert remote.get_metadata() == {"step": 3}

    # a run went back to checkpoint 2: the store forgets step 3 in storage too
    storage.drop_steps_after(2)
    assert storage.list("trajectories") == ["step_000001.parquet", "step_000002.parquet"]

    fresh = tmp_path / "other-copy" / "job"  # a new job's working copy: nothing local
    assert open_storage(uri, fresh, resume=True) is not None
    restored = fresh / "checkpoints" / "step_000003"
    assert json.loads((restored / "controller.json").read_text()) == {"step": 3}
    assert (restored / "llama" / "trainer_rank0.pt").read_bytes() == bytes([3]) * 100
    assert not (restored / ".metadata.json").exists()
    assert (fresh / "config.yaml").read_text() == "run: {name: job}\n"
    assert sorted(p.name for p in (fresh / "trajectories").iterdir()) == ["step_000001.parquet", "step_000002.parquet"]

    nothing = open_storage((tmp_path / "empty").as_uri(), tmp_path / "x" / "job", resume=True)
    assert nothing.checkpoint_names() == [] and not (tmp_path / "x" / "job" / "checkpoints").exists()
    assert RunStorage(str(tmp_path / "shared"), "job").checkpoint_names() == storage.checkpoint_names()
