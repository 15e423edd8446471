"""A lost node that held a model's generation replica and its trainer ranks, noticed first by the
replica's death during generation (tests/node_loss_run.py: a real multi-node Ray cluster on this
machine, the node removed). The ranks went with it, and so did the only copy of the last sync's
weights, which a restarted replica would reload: the run must go back to the checkpoint as for a
trainer's death, not restart the replica alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference_run import STEPS, overrides

ROOT = Path(__file__).resolve().parent.parent
LOSE_AT = 2  # the node goes as this step's generation starts, after the step-1 checkpoint and sync

pytestmark = pytest.mark.slow


def test_a_node_lost_with_a_replica_and_its_trainer_ranks_sends_the_model_back_to_the_checkpoint(tmp_path):
    done = subprocess.run([sys.executable, "-m", "tests.node_loss_run", str(tmp_path), str(LOSE_AT),
                           *overrides(tmp_path, "lost", [])], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert "lost" in result, "the node was never removed"
    assert "error" not in result, result["error"] + "\n" + result.get("traceback", "")
    summary = result["summary"]
    assert summary["steps"] == STEPS
    trainer = [f for f in summary["faults"] if f["kind"] == "trainer" and "gpt2-bpe" in f["actor"]]
    assert trainer and trainer[0]["step"] == LOSE_AT and "checkpoint" in trainer[0]["action"], summary["faults"]
    assert not any(f["action"] == "stopped the run" for f in summary["faults"])
