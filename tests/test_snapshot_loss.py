"""A step snapshot whose files went with a lost node (``restore_snapshot_else``), without a cluster:
Ray's lost-object error as the driver's ``ray.get`` of a rank's ``load_snapshot`` raises it (a
``RayTaskError`` that is also an ``ObjectReconstructionFailedError``, as ``tests/test_node_loss.py``
meets it on a real multi-node cluster). The snapshot is dropped and the checkpoint restored, or the
run stopped with one line where there is none; any other error goes on up."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from ray.exceptions import ObjectLostError, ObjectReconstructionFailedError, RayTaskError

from orchestrator.controller import snapshot as snapshots
from orchestrator.controller.run_state import Snapshot


class Stopped(Exception):
    pass


def lost() -> BaseException:
    cause = ObjectReconstructionFailedError("ab" * 28)
    return RayTaskError("TorchTrainer.load_snapshot", "Traceback ...", cause).as_instanceof_cause()


def restore(monkeypatch, error: BaseException, folder: Path | None) -> tuple[object, dict, list[Path]]:
    snap = Snapshot(3, {}, {"step": 3}, {}, {}, None)
    ctrl = SimpleNamespace(state=SimpleNamespace(snapshot=snap))
    restored: list[Path] = []

    def fail(*_):
        raise error

    monkeypatch.setattr(snapshots, "restore_snapshot", fail)
    monkeypatch.setattr(snapshots, "restore_checkpoint", lambda _, f: restored.append(f) or 2)
    entry = {"action": "went back to the snapshot of step 3"}
    result = snapshots.restore_snapshot_else(ctrl, snap, folder, entry, lambda why: Stopped(why))
    return (result, ctrl.state.snapshot), entry, restored


def test_the_lost_object_error_is_recognised():
    assert isinstance(lost(), ObjectLostError) and snapshots.lost_objects(lost())
    assert not snapshots.lost_objects(RuntimeError("x"))


def test_a_lost_snapshot_is_dropped_for_the_checkpoint(monkeypatch):
    with pytest.warns(UserWarning, match="snapshot of step 3 was lost with its node"):
        (step, kept), entry, restored = restore(monkeypatch, lost(), Path("ckpt/step_000002"))
    assert step == 2 and kept is None and restored == [Path("ckpt/step_000002")]
    assert entry["action"].endswith("lost with its node: went back to checkpoint step_000002")


def test_a_lost_snapshot_without_a_checkpoint_stops_the_run_with_one_line(monkeypatch):
    with pytest.raises(Stopped, match=r"the snapshot of step 3 was lost with its node .*no checkpoint.*"
                                      r"run.checkpoint_every > 0.*survive a node's loss"):
        restore(monkeypatch, lost(), None)


def test_another_error_goes_on_up(monkeypatch):
    with pytest.raises(ValueError):
        restore(monkeypatch, ValueError("not a lost object"), Path("ckpt/step_000002"))
