"""``run.storage`` (``orchestrator/controller/run_storage.py``) on a ``file://`` URI: checkpoints uploaded as
Ray Train checkpoints and pruned, the store mirrored, and a fresh run folder restored from it.
The end-to-end path (two ``ray job submit`` jobs, the second resuming from storage) is in
``tests/test_job_submit.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.train import Checkpoint

from orchestrator.config import ConfigError
from orchestrator.controller.checkpoint import latest_checkpoint
from orchestrator.controller.run_storage import RunStorage, open_storage
from tests.reference_run import assert_same_run

ROOT = Path(__file__).resolve().parent.parent


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


def test_a_fresh_run_refuses_a_storage_that_holds_an_earlier_run_of_its_name(tmp_path):
    """A job started without --resume in a new working copy, under the run.name and run.storage
    of an earlier run: before the fix it wrote beside the earlier run's checkpoints (its own
    step_000001 deleted at once by keep_checkpoints, the earlier step_000005 kept) and its store
    files over the earlier run's, so a later --resume took the earlier run's checkpoint."""
    uri = (tmp_path / "shared").as_uri()
    earlier = tmp_path / "first-copy" / "job"
    storage = open_storage(uri, earlier, resume=False)
    (earlier / "trajectories").mkdir(parents=True)
    for step in (4, 5):
        path = earlier / "trajectories" / f"step_{step:06d}.parquet"
        path.write_bytes(b"earlier run %d" % step)
        storage.mirror(path)
        storage.save_checkpoint(_checkpoint(earlier, step), step, keep=2)

    with pytest.raises(ConfigError, match=r"run.storage: .*/job holds an earlier run's checkpoints "
                                          r"\(latest step_000005\): pass --resume"):
        open_storage(uri, tmp_path / "second-copy" / "job", resume=False)
    assert storage.list("trajectories") == ["step_000004.parquet", "step_000005.parquet"]
    assert open_storage(uri, tmp_path / "third-copy" / "job", resume=True).checkpoint_names() == [
        "step_000004", "step_000005"]
    assert open_storage(uri, tmp_path / "other" / "job-2", resume=False).checkpoint_names() == []

    no_checkpoints = RunStorage(uri, "store-only", tmp_path / "store-only")  # checkpoint_every: 0
    (tmp_path / "store-only" / "trajectories").mkdir(parents=True)
    (tmp_path / "store-only" / "trajectories" / "step_000001.parquet").write_bytes(b"rows")
    no_checkpoints.mirror(tmp_path / "store-only" / "trajectories" / "step_000001.parquet")
    with pytest.raises(ConfigError, match="holds an earlier run's store files"):
        open_storage(uri, tmp_path / "again" / "store-only", resume=False)



def test_checkpoints_reach_an_object_store_that_renames_no_folder(tmp_path):
    """Issue #51's twelfth read: ``run.storage: s3://...`` (operations.md's example) has no folder
    rename: Arrow's S3 ``move`` copies one object, so a checkpoint uploaded under a temporary name
    and then moved into place failed at the run's first (step-0) checkpoint. On a local folder
    with S3's ``move`` (``tests/object_store_fs.py``) the checkpoints are kept and pruned, an upload
    cut short (no metadata yet) is never taken for a checkpoint, and a fresh run folder is
    restored from the latest whole one."""
    from tests.object_store_fs import object_store_like

    run_dir = tmp_path / "work" / "job"
    storage = open_storage(str(tmp_path / "bucket"), run_dir, resume=False)
    storage.fs = object_store_like()
    for step in (1, 2, 3):
        storage.save_checkpoint(_checkpoint(run_dir, step), step, keep=2)
    assert storage.checkpoint_names() == ["step_000002", "step_000003"]
    assert Checkpoint(storage._path("checkpoints", "step_000003"), storage.fs).get_metadata() == {"step": 3}
    cut = _checkpoint(run_dir, 4)  # its files uploaded, the job stopped before its metadata
    storage.upload(cut, "checkpoints", cut.name)
    assert storage.checkpoint_names() == ["step_000002", "step_000003"]

    fresh = RunStorage(str(tmp_path / "bucket"), "job")
    fresh.fs = object_store_like()
    assert fresh.restore_into(tmp_path / "other-copy" / "job") == 3
    restored = tmp_path / "other-copy" / "job" / "checkpoints" / "step_000003"
    assert (restored / "llama" / "trainer_rank0.pt").read_bytes() == bytes([3]) * 100

def test_a_restore_cut_short_leaves_no_checkpoint_and_the_next_resume_downloads_it_whole(tmp_path):
    """Issue #51's thirteenth read: a job on a fresh head resuming from ``run.storage`` downloads
    the latest checkpoint (75.6 GB for the GPU template: minutes). A download cut short (the job
    stopped, a read that failed) left a ``step_*`` folder with some of its files, so the next
    resume downloaded nothing and took it: with ``controller.json`` among them, a checkpoint whose
    trainer files are missing; without it, no checkpoint, a run from step 0 over the stored one."""
    from tests.object_store_fs import ObjectStoreMoves

    class ReadFails(ObjectStoreMoves):
        """The trainer's file cannot be read (a connection reset); every other call as before."""

        def _check(self, path):
            if path.endswith("trainer_rank0.pt"):
                raise OSError("connection reset by peer")

        def open_input_stream(self, path):
            self._check(path)
            return super().open_input_stream(path)

        def open_input_file(self, path):
            self._check(path)
            return super().open_input_file(path)

    stored = tmp_path / "work" / "job"
    storage = open_storage(str(tmp_path / "bucket"), stored, resume=False)
    for step in (1, 2):
        storage.save_checkpoint(_checkpoint(stored, step), step, keep=2)
    fresh = tmp_path / "fresh-head" / "job"
    cut = RunStorage(str(tmp_path / "bucket"), "job")
    cut.fs = pafs.PyFileSystem(ReadFails())
    with pytest.raises(OSError, match="connection reset"):
        cut.restore_into(fresh)
    assert latest_checkpoint(fresh) is None

    open_storage(str(tmp_path / "bucket"), fresh, resume=True)  # the job submitted again
    restored = latest_checkpoint(fresh)
    assert restored is not None and restored.name == "step_000002"
    assert (restored / "llama" / "trainer_rank0.pt").read_bytes() == bytes([2]) * 100
    assert sorted(p.name for p in (fresh / "checkpoints").iterdir()) == ["step_000002"]


def test_a_job_resumed_from_storage_gets_the_runs_metric_log_and_flows(tmp_path, ray_local):
    """Issue #51's thirteenth read: a job resumed from ``run.storage`` on a new head (the one
    whose disk held the run folder lost) got the checkpoint, config and store, but not the run
    folder's ``metrics.jsonl``, ``faults.jsonl`` and ``flow_matrix.json``: the steps before the
    checkpoint were in none of its records (its MLflow store is new too). They are uploaded with
    each checkpoint and downloaded with it."""
    import yaml

    from orchestrator.config import load_config
    from orchestrator.controller.loop import Controller

    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["verifier_actors"] = 1
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    uri = (tmp_path / "shared").as_uri()
    Controller(load_config(tmp_path / "job.yaml", [
        "run.steps=1", "run.eval_every=0", "run.name=job", f"run.storage={uri}", "run.checkpoint_every=1",
        "algorithm.prompt_batch=4", f"run.output_dir={tmp_path / 'lost-head'}"])).run()
    logged = [json.loads(line) for line in (tmp_path / "lost-head" / "job" / "metrics.jsonl").read_text().splitlines()]
    assert any(line.get("step") == 1 for line in logged)

    fresh = tmp_path / "new-head" / "job"
    open_storage(uri, fresh, resume=True)  # the job submitted again on the new head, with --resume
    assert latest_checkpoint(fresh).name == "step_000001"
    restored = [json.loads(line) for line in (fresh / "metrics.jsonl").read_text().splitlines()]
    step1 = [line for line in restored if line.get("step") == 1]  # as logged up to the step-1 checkpoint
    assert step1 == [line for line in logged if line.get("step") == 1][:len(step1)]
    assert any("train/reward_mean" in line["metrics"] for line in step1)
    flows = json.loads((fresh / "flow_matrix.json").read_text())["steps"]
    assert [f["step"] for f in flows] == [1]


@pytest.mark.slow
def test_trainers_without_a_shared_disk_checkpoint_resume_and_export(tmp_path, demo_reference):
    """Every actor of the run in a working folder of its own, the driver in another, the run folder
    relative (``tests/apart_run.py``): what a cluster job without a shared disk sees. The trainer
    ranks' checkpoint shards and final models reach the driver's run folder through the object
    store, and back on a resume; a run stopped after its step-2 checkpoint and resumed (a trainer
    rank killed on the way, so the checkpoint is loaded a second time) ends equal to the reference
    run on one shared folder: store, evaluations, metrics and final weights. A ``run.storage``
    that the actors resolve elsewhere than the driver fails before step 0, naming the node, the
    path and ``run.storage``."""
    done = subprocess.run([sys.executable, "-m", "tests.apart_run", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["driver_cwd"] != result["actor_cwd"]

    error = result["split_error"]
    assert error is not None and error.startswith("ConfigError: run.storage: trainer rank 0 of model"), error
    assert "on node 127.0.0.1" in error and str(Path(result["actor_cwd"]) / "store" / "split") in error
    assert result["split_files"] == []  # failed before step 0: no checkpoint, no store file

    assert result["stopped_at"][-1] == "step_000002"
    faults = result["summary"]["faults"]
    assert [(f["kind"], f["step"], f["actor"]) for f in faults] == [("trainer", 3, "trainer rank 1 of model gpt2-bpe")]
    assert "checkpoint step_000002" in faults[0]["action"]
    assert result["actor_files"] == ["README"]  # nothing of the run was left in the actors' folders
    assert_same_run(tmp_path / "head" / "runs" / "apart", demo_reference)


def test_an_object_store_that_only_the_driver_reaches_passes_the_start_up_probe(tmp_path, ray_local):
    """Issue #51's fourteenth read: only the driver (on the head) reads or writes ``run.storage``,
    but the start-up probe made every trainer rank read it too, so an ``s3://`` storage stopped
    every run before step 0 on ``cluster.yaml``, whose GPU workers hold no AWS credentials (Ray's
    launcher gives its instance profile, with S3 access, to the head alone). Arrow's in-memory
    ``mock://`` filesystem is such a store here: each process opens one of its own, so the ranks
    see nothing the driver wrote there, as a worker node without credentials sees nothing in S3.
    The run checkpoints into the driver's store, and a path probe (a local folder the ranks do not
    see) is still refused by ``tests/apart_run.py``."""
    import yaml

    from orchestrator.config import load_config
    from orchestrator.controller.loop import Controller

    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["verifier_actors"] = 1
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    controller = Controller(load_config(tmp_path / "job.yaml", [
        "run.steps=1", "run.eval_every=0", "run.name=job", "run.storage=mock:///bucket/runs",
        "run.checkpoint_every=1", "algorithm.prompt_batch=4", f"run.output_dir={tmp_path / 'head'}"]))
    controller.run()
    assert controller.storage.checkpoint_names()[-1] == "step_000001"
    assert controller.storage.list("trajectories") == ["step_000001.parquet"]


@pytest.mark.parametrize("storage", [
    "s4://bucket/runs",  # a misspelt scheme: pyarrow's ArrowInvalid
    "{tmp}/a-file/runs",  # a path the driver cannot create (a file where a folder should be)
    # a bucket the head cannot reach, as one without credentials cannot read it: Arrow's S3 client
    # against a closed loopback port (its HeadBucket fails after Arrow's retries, about 13 s)
    "s3://graftpool-test/runs?endpoint_override=127.0.0.1:9&scheme=http&region=us-east-1",
])
def test_a_storage_the_driver_cannot_use_fails_at_start_naming_run_storage(tmp_path, capsys, monkeypatch, storage):
    """Issue #51's seventeenth read: a ``run.storage`` the driver could not open, list or write
    (a URI with a misspelt scheme, an ``s3://`` bucket a head without credentials cannot read, a
    path it may not create) stopped the run with pyarrow's raw traceback (``ArrowInvalid:
    Unrecognized filesystem type``, ``OSError: When testing for existence of bucket ...``), naming
    neither the field nor what it takes, where the README says a config's errors name the field.
    Now it is a config error (exit 2) naming ``run.storage``, said before Ray starts (``init_ray``
    is never reached; whether a Ray instance is up says nothing here: the session's may be)."""
    from orchestrator.cli import main
    from orchestrator.controller import loop

    monkeypatch.setattr(loop, "init_ray", lambda *_, **__: pytest.fail("Ray was started before the storage was checked"))

    (tmp_path / "a-file").write_text("not a folder")
    code = main(["run", str(ROOT / "configs" / "demo_pair.yaml"), "--set", "run.steps=1",
                 "--set", f"run.output_dir={tmp_path / 'runs'}",
                 "--set", f"run.storage={storage.format(tmp=tmp_path)}"])
    said = capsys.readouterr().err
    assert code == 2, said
    # the error's own line: a Ray instance of an earlier test in this process may still be
    # streaming its actors' log lines (``log_to_driver``) into the same stderr
    error = "\n".join(line for line in said.split("\n") if not line.startswith("\x1b[36m("))
    assert error.startswith("error: run.storage: the driver cannot use ") and "s3://bucket/prefix" in error, said
