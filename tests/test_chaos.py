"""Chaos, shortened (``make chaos`` runs the long version, ``tests/chaos.py``): the demo pair's
reference run (``tests/reference_run.py``) with five processes SIGKILLed at chosen stages: a
generation replica in its ``__init__``, a math-verify child while it judges, a replica during
the weight sync and a verifier actor while the run recovers from that, and a trainer rank while
a checkpoint is written. The run ends equal to the uninterrupted reference run (store,
evaluation files, summary, metrics, final weights), each kill was recovered from (or, for the
child, absorbed by its actor), and each death and recovery is in MLflow (a metric and a tag on
the job's run) and in the HTML report.

Shares the reference run with ``tests/test_faults.py`` and ``tests/test_startup_faults.py``
(one xdist unit: ``tests/xdist_units.py``)."""

from __future__ import annotations

import json

import pytest
from mlflow.tracking import MlflowClient

from dashboards.data import load_run
from dashboards.mlflow_basics import FAULT_TAG
from dashboards.report import render_report
from tests.chaos import Kill, chaos_run, tables
from tests.reference_run import assert_same_run

pytestmark = pytest.mark.slow

PLAN = [
    Kill("start-up", "generator"),  # in __init__: the run starts it again
    Kill("verify", "math-child", 0.02),  # its actor starts another child, which judges the answer again
    Kill("sync", "generator"),  # the sync is redone once a new replica has the weights
    Kill("recovery", "verifier", 0.05, 0.99),  # while that replica starts: a second death during recovery
    Kill("checkpoint", "trainer", 0.0, 0.99),  # back to the previous checkpoint
]


def test_a_run_with_kills_at_five_stages_ends_as_the_reference(demo_reference, tmp_path):
    result = chaos_run(tmp_path, "chaos", 0, PLAN)
    print("\n" + tables([result]))
    assert not result.error, result.error
    assert not result.skipped, result.skipped
    assert [k.victim for k in result.killed] == [k.victim for k in PLAN]
    assert_same_run(tmp_path / "chaos", demo_reference)  # every row, no duplicate, no loss

    outcomes = [(k.victim, k.outcome) for k in result.killed]
    assert outcomes == [("generator", "recovered"), ("math-child", "absorbed"), ("generator", "recovered"),
                        ("verifier", "recovered"), ("trainer", "recovered")], result.killed
    assert not result.unexplained, result.unexplained
    summary = json.loads((tmp_path / "chaos" / "summary.json").read_text())
    faults = summary["faults"]
    assert len(faults) == 4 and all(f["recovery_s"] >= 0 for f in faults)
    assert faults[0]["phase"] == "start-up"
    trainer = next(f for f in faults if f["kind"] == "trainer")
    # noticed by the checkpoint's save, or (a rank that had saved already) by the next step's update
    assert trainer["stage"] in ("checkpoint", "score", "train") and "went back to checkpoint step_" in trainer["action"]

    # MLflow: a tag per death on the job's run (the entry, with its time to recover) and the metrics
    pointer = json.loads((tmp_path / "chaos" / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=pointer["tracking_uri"])
    run = client.get_run(pointer["parent_run_id"])
    tagged = sorted((json.loads(v) for k, v in run.data.tags.items() if k.startswith(FAULT_TAG)),
                    key=lambda f: f["time"])
    assert [(f["actor"], f["stage"], f["recovery_s"]) for f in tagged] == \
        [(f["actor"], f["stage"], f["recovery_s"]) for f in faults]
    recovery = client.get_metric_history(pointer["parent_run_id"], "faults/recovery_s")
    assert sorted(m.value for m in recovery) == sorted(f["recovery_s"] for f in faults)
    assert max(m.value for m in client.get_metric_history(pointer["parent_run_id"], "faults/deaths")) == 4

    # the HTML report: the faults section lists every death, read from MLflow
    data = load_run(str(tmp_path / "chaos"))
    assert len(data.faults) == 4 and data.source.startswith("MLflow")
    html = render_report(data)
    assert '<p id="faults">4 deaths, 4 recovered' in html
    for f in faults:
        assert f["actor"] in html
