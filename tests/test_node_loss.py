"""A lost node that held a model's generation replica and its trainer ranks, noticed first by the
replica's death during generation (tests/node_loss_run.py: a real multi-node Ray cluster on this
machine, the node removed). The ranks went with it, and so did the only copy of the last sync's
weights, which a restarted replica would reload: the run must go back to the checkpoint as for a
trainer's death, not restart the replica alone.

With step snapshots (``run.step_snapshot=on``) the ranks' snapshot files went with the node too
(their only copy was in its object store): the snapshot of step 3, newer than the checkpoint of
step 2, cannot be restored, and the run must go back to that checkpoint instead."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference_run import STEPS, overrides

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow

# (the step whose generation start loses the node, extra overrides, the checkpoint gone back to)
CASES = {
    "checkpoints": (2, [], "step_000001"),  # after the step-1 checkpoint and sync
    "lost-snapshot": (4, ["run.step_snapshot=on", "run.checkpoint_every=2"], "step_000002"),
}


@pytest.mark.parametrize("case", CASES)
def test_a_node_lost_with_a_replica_and_its_trainer_ranks_sends_the_model_back_to_the_checkpoint(tmp_path, case):
    lose_at, extra, checkpoint = CASES[case]
    done = subprocess.run([sys.executable, "-m", "tests.node_loss_run", str(tmp_path), str(lose_at),
                           *overrides(tmp_path, "lost", extra)], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert "lost" in result, "the node was never removed"
    assert "error" not in result, result["error"] + "\n" + result.get("traceback", "")
    summary = result["summary"]
    assert summary["steps"] == STEPS
    trainer = [f for f in summary["faults"] if f["kind"] == "trainer" and "gpt2-bpe" in f["actor"]]
    assert trainer and trainer[0]["step"] == lose_at, summary["faults"]
    assert any("checkpoint" in f["action"] and checkpoint in f["action"] for f in trainer), summary["faults"]
    assert not any(f["action"] == "stopped the run" for f in summary["faults"])
