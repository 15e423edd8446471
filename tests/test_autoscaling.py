"""A job on an autoscaling cluster whose head alone cannot hold it (``cluster.yaml``'s shape: a
small head, a worker type at ``min_workers: 0``), with Ray's real autoscaler and its fake
multi-node provider on this machine (``tests/autoscaling_cluster.py``: 127.0.0.1, token
authentication on).

The demo pair asks for 2.5 CPUs (four 0.5-CPU model bundles, two 0.25-CPU verifiers); the head
has 1. A job that asks for a bundle no node type holds fails at start, naming it and the node
types, and no node is added for it; the demo pair, submitted with ``ray job submit``, waits while
the autoscaler adds a worker node, and trains. Before, the driver compared the head's CPUs with
the request at once and failed both, the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from orchestrator.cluster.autoscale import NodeType, autoscaling_config_path, never_fits, node_types, unplaced
from orchestrator.cluster.placement import check_local, job_bundles
from orchestrator.config import load_config
from tests.autoscaling_cluster import autoscaling_cluster
from tests.test_job_submit import ROOT, _submit

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLUSTER = {
    "max_workers": 1,
    "idle_timeout_minutes": 5,
    "head_node_type": "head.cpu",
    "available_node_types": {
        "head.cpu": {"resources": {"CPU": 1}},
        # object store kept small: the fake node is a real raylet on this machine
        "worker.cpu": {"resources": {"CPU": 4, "object_store_memory": 300 * 2**20}, "min_workers": 0, "max_workers": 1},
    },
}
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


def test_bundles_are_packed_first_fit_largest_first_on_the_nodes():
    gpu, cpu = {"CPU": 4, "GPU": 1}, {"CPU": 1}
    assert unplaced([cpu, gpu, cpu], [{"CPU": 8}, {"CPU": 5, "GPU": 1}]) == []
    assert unplaced([gpu, gpu, cpu], [{"CPU": 8}, {"CPU": 5, "GPU": 1}]) == [gpu]
    # enough CPUs in all, but no single node holds a 3-CPU bundle
    assert unplaced([{"CPU": 3}], [{"CPU": 2}, {"CPU": 2}]) == [{"CPU": 3}]
    assert unplaced([{"CPU": 1, "trainer": 0.1}], [{"CPU": 8}]) == [{"CPU": 1, "trainer": 0.1}]


def test_node_types_of_the_shipped_cluster_yaml():
    """cluster.yaml: a bundle asking for a GPU fits its GPU workers only; one asking for 8 GPUs,
    or a resource no node type has, never fits."""
    import yaml

    types = node_types(yaml.safe_load((ROOT / "cluster.yaml").read_text()))
    assert types == [NodeType("head.cpu", {"CPU": 8.0}), NodeType("worker.gpu", {"CPU": 48.0, "GPU": 4.0})]
    asks = [{"CPU": 4, "GPU": 1}, {"CPU": 1, "GPU": 8}, {"CPU": 1, "trainer": 1}, {"CPU": 48}]
    assert never_fits(asks, types) == asks[1:3]
    # a worker type that may not run (max_workers 0), and one whose resources the cloud fills in
    assert node_types({"head_node_type": "h", "available_node_types": {
        "h": {"resources": {"CPU": 1}, "max_workers": 0}, "w": {"resources": {"GPU": 1}, "max_workers": 0}}}) \
        == [NodeType("h", {"CPU": 1.0})]
    assert node_types({"head_node_type": "h", "available_node_types": {"h": {"resources": {}}, "w": {}}}) is None


def test_the_monitors_autoscaling_config_is_read_as_it_reads_it(tmp_path):
    assert autoscaling_config_path(["monitor.py", "--autoscaling-config=~/boot.yaml"], tmp_path) == \
        Path("~/boot.yaml").expanduser()
    assert autoscaling_config_path(["monitor.py", "--autoscaling-config", "c.json"], tmp_path) == tmp_path / "c.json"
    assert autoscaling_config_path(["monitor.py", "--gcs-address=127.0.0.1:1"], tmp_path) is None


def test_a_local_instance_without_what_the_bundles_ask_for_fails_at_once_naming_it():
    config = load_config(ROOT / "configs" / "demo_pair.yaml", ["models.0.trainer.num_gpus=1"])
    bundles = job_bundles(config)
    assert {"CPU": 0.5, "GPU": 1} in bundles and {"CPU": 0.25} in bundles and len(bundles) == 6
    assert len(job_bundles(config, with_trainer=False)) == 4
    with pytest.raises(RuntimeError, match=r"has 0 GPU \(asked: 1\): the job's actors ask for .*num_gpus"):
        check_local({"CPU": 8.0}, bundles)
    with pytest.raises(RuntimeError, match=r"has 2 CPU \(asked: 2.5\).*ray.num_cpus"):
        check_local({"CPU": 2.0, "GPU": 1.0}, bundles)
    check_local({"CPU": 2.5, "GPU": 1.0}, bundles)
