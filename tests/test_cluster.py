"""Multi-node on one machine: a pair run on a ``ray.cluster_utils.Cluster`` (head + three
worker nodes, custom resources pinning the llama model's generation replica to one node and
its two trainer ranks to two others, ``placement: spread``), with one of those nodes removed
after the step-1 checkpoint. The job recovers on the nodes left, and its store equals, row for
row, the same run on one node without any fault (``tests/cluster_run.py`` drives the cluster in
a process of its own; everything listens on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import load_config
from orchestrator.loop import train
from tests.platform_checks import read_store

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
STEPS, REMOVE_AFTER = 3, 1
SMALL = ["algorithm.prompt_batch=8", "run.eval_every=0", "data.eval=[]", "data.verifier=exact"]
KEY = ("step", "model", "kind", "source_model", "prompt_id", "sample")


def _sorted(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in KEY))


def test_pair_run_across_nodes_survives_losing_a_trainer_node(tmp_path, ray_local):
    reference = load_config(DEMO, [*SMALL, "models.0.trainer.workers=2", f"run.steps={STEPS}",
                                   f"run.output_dir={tmp_path / 'single'}", "run.name=single"])
    train(reference)

    out = tmp_path / "multi"
    done = subprocess.run([sys.executable, "-m", "tests.cluster_run", str(out), str(STEPS), str(REMOVE_AFTER),
                           *SMALL], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    nodes, before, after = result["nodes"], result["before"]["llama-char"], result["after"]["llama-char"]

    # before the loss: generation on `gen`, the two ranks on `t1` and `t2`; gpt2 on the head
    assert before["generation"] == [nodes["gen"]]
    assert sorted(before["trainers"]) == sorted([nodes["t1"], nodes["t2"]])
    assert set(result["before"]["gpt2-bpe"]["trainers"]) == {result["head"]}
    # after: both ranks on the trainer node left
    assert result["removed_after_step"] == REMOVE_AFTER
    assert after["trainers"] == [nodes["t1"], nodes["t1"]] and after["generation"] == [nodes["gen"]]
    assert result["summary"]["steps"] == STEPS
    assert any(f["kind"] == "trainer" and "llama-char" in f["actor"] for f in result["summary"]["faults"])

    # the same store as the single-node run without a fault: nothing lost, nothing duplicated
    single, multi = _sorted(read_store(tmp_path / "single" / "single")), _sorted(read_store(out / "cluster"))
    assert len({tuple(r[k] for k in KEY) for r in multi}) == len(multi)
    assert len(multi) == len(single) > 0
    for a, b in zip(single, multi, strict=True):
        assert a == b, (a, b)
