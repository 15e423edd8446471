"""A job on an autoscaling cluster whose head alone cannot hold it (``cluster.yaml``'s shape: a
small head, a worker type at ``min_workers: 0``), with Ray's real autoscaler and its fake
multi-node provider on this machine (``tests/autoscaling_cluster.py``: 127.0.0.1, token
authentication on).

The demo pair asks for 2.5 CPUs (four 0.5-CPU model bundles, two 0.25-CPU verifiers); the head
has 1. A job that asks for a bundle no node type holds fails at start, naming it and the node
types, and no node is added for it; the demo pair, submitted with ``ray job submit``, waits while
the autoscaler adds a worker node, and trains; bundles the autoscaler cannot add nodes for
(``max_workers``) time out after ``ray.wait_for_resources_s``, naming them. Before, the driver
compared the head's CPUs with the request at once and failed every one the same way. The tests
share one cluster and run in file order."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid

import pytest

from tests.autoscaling_cluster import autoscaling_cluster, one_worker_type
from tests.test_job_submit import ROOT, _submit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLUSTER = one_worker_type(1, "worker.cpu", {"CPU": 4})
CACHE = {"GRAFTPOOL_CACHE": os.environ.get("GRAFTPOOL_CACHE") or str(ROOT / ".cache")}  # the zoo models built
SETS = ["run.steps=1", "run.eval_every=0", "algorithm.prompt_batch=8", "eval.max_prompts=4", "eval.samples=2"]


def _nodes(cluster) -> list[dict]:
    """The cluster's live nodes, as ``ray list nodes`` (the state API, with the token) says."""
    listed = cluster.ray("list", "nodes", "--address", cluster.address, "--format", "json", "--filter", "state=ALIVE")
    assert listed.returncode == 0, listed.stderr[-2000:]
    return json.loads(listed.stdout)


@pytest.fixture(scope="module")
def cluster():
    with autoscaling_cluster(CLUSTER) as started:
        yield started


def _run_args(*sets: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator", "run", "configs/demo_pair.yaml",
            *[a for s in [*SETS, *sets] for a in ("--set", s)]]


@pytest.mark.slow
def test_a_bundle_no_node_type_holds_fails_at_start_naming_it(cluster, tmp_path):
    """A trainer rank asking for 8 CPUs: no node type has them. The driver (the CLI, given
    ray.address) fails before any actor starts, naming the bundle and the node types, and asks
    the autoscaler for nothing. (Runs first: the cluster has its head only.)"""
    never = subprocess.run(_run_args("models.0.trainer.num_cpus=8", f"ray.address={cluster.gcs_address}",
                                     f"run.output_dir={tmp_path}"),
                           env={**cluster.env, **CACHE}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    said = never.stdout + never.stderr
    assert never.returncode != 0, said[-3000:]
    assert "no node type of the cluster can hold the job's bundle(s) 1 x {CPU: 8}" in said, said[-3000:]
    assert "ray.head.default {CPU: 1}; worker.cpu {CPU: 4}" in said, said[-3000:]
    assert len(_nodes(cluster)) == 1


@pytest.mark.slow
def test_a_job_submitted_to_a_cluster_too_small_for_it_waits_for_the_autoscaler_and_trains(cluster, tmp_path):
    """The demo pair: the head holds 1 of its 2.5 CPUs; the job waits for the worker node."""
    job_id = f"gp-{uuid.uuid4().hex[:12]}"
    out = _submit(cluster, job_id, {"env_vars": CACHE}, _run_args("run.name=autoscaled", f"run.output_dir={tmp_path}"))
    status = cluster.ray("job", "status", "--address", cluster.address, job_id)
    assert f"Job '{job_id}' succeeded" in status.stdout + status.stderr, out[-4000:]
    assert "for the autoscaler to add the nodes of the job's bundles: 4 x {CPU: 0.5}, 2 x {CPU: 0.25}" in out, \
        out[-4000:]
    assert "the cluster holds the job's bundles after" in out and "(2 nodes, CPU 5, GPU 0)" in out, out[-4000:]
    nodes = _nodes(cluster)
    assert len(nodes) == 2, nodes
    summary = json.loads((tmp_path / "autoscaled" / "summary.json").read_text())
    assert summary["steps"] == 1 and set(summary["models"]) == {"llama-char", "gpt2-bpe"}
    # the head holds 1 CPU of the models' 2: some of their actors ran on the new worker node
    placed = json.loads((tmp_path / "autoscaled" / "actors.json").read_text())
    worker = {n["node_id"] for n in nodes if not n["is_head_node"]}
    assert worker & {node for model in placed.values() for ids in model.values() for node in ids}, (placed, nodes)



@pytest.mark.slow
def test_bundles_the_autoscaler_cannot_add_nodes_for_time_out_naming_them_and_the_field(cluster, tmp_path):
    """Two trainer ranks of 3 CPUs: the worker type holds one, but ``max_workers: 1`` allows one
    worker node, so the second is never placed; the wait ends after ``ray.wait_for_resources_s``
    with an error naming what is missing and the field. (Runs after the job above.)"""
    short = subprocess.run(_run_args("models.0.trainer.num_cpus=3", "models.1.trainer.num_cpus=3",
                                     "ray.wait_for_resources_s=5", f"ray.address={cluster.gcs_address}",
                                     f"run.output_dir={tmp_path}"),
                           env={**cluster.env, **CACHE}, cwd=ROOT, capture_output=True, text=True, timeout=600)
    said = short.stdout + short.stderr
    assert short.returncode != 0, said[-3000:]
    assert "waiting up to 5 s (ray.wait_for_resources_s) for the autoscaler" in said, said[-3000:]
    assert re.search(r"still cannot hold [12] x \{CPU: 3\} of the job's bundles", said), said[-3000:]
    assert "raise ray.wait_for_resources_s to wait longer" in said, said[-3000:]
