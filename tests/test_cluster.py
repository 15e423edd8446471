"""Multi-node on one machine: the demo pair's reference run (``tests/reference_run.py``) on a
``ray.cluster_utils.Cluster`` (head + three worker nodes, custom resources pinning the gpt2
model's generation replica to one node and its two trainer ranks to two others, ``placement:
spread``), with one of those nodes removed after the step-1 checkpoint. The job recovers on the
nodes left and ends equal to the reference run on one node without any fault: store, evaluation
responses, metrics and final weights (``tests/cluster_run.py`` drives the cluster in a process of
its own; everything listens on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reference_run import STEPS, assert_same_run, overrides

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
REMOVE_AFTER = 1


def test_pair_run_across_nodes_survives_losing_a_trainer_node(tmp_path, demo_reference):
    out = tmp_path / "multi"
    done = subprocess.run([sys.executable, "-m", "tests.cluster_run", str(out), str(REMOVE_AFTER),
                           *overrides(out, "cluster")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    nodes, before, after = result["nodes"], result["before"]["gpt2-bpe"], result["after"]["gpt2-bpe"]

    # before the loss: generation on `gen`, the two ranks on `t1` and `t2`; llama on the head
    assert before["generation"] == [nodes["gen"]]
    assert sorted(before["trainers"]) == sorted([nodes["t1"], nodes["t2"]])
    assert set(result["before"]["llama-char"]["trainers"]) == {result["head"]}
    # after: both ranks on the trainer node left
    assert result["removed_after_step"] == REMOVE_AFTER
    assert after["trainers"] == [nodes["t1"], nodes["t1"]] and after["generation"] == [nodes["gen"]]
    assert result["summary"]["steps"] == STEPS
    assert any(f["kind"] == "trainer" and "gpt2-bpe" in f["actor"] for f in result["summary"]["faults"])

    # the same run as the single-node one without a fault: nothing lost, nothing duplicated
    assert_same_run(out / "cluster", demo_reference)
