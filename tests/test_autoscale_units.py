"""The pieces of a job's start on a cluster (``orchestrator.cluster.autoscale``,
``orchestrator.cluster.placement``) without Ray: packing bundles on nodes, the node types of an
autoscaling config, the monitor's config path, and a local instance's immediate check. The
cluster itself: ``tests/test_autoscaling.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.cluster.autoscale import (
    NodeType,
    autoscaling_config_path,
    never_fits,
    node_types,
    unplaced,
)
from orchestrator.cluster.placement import check_local, job_bundles
from orchestrator.config import load_config

ROOT = Path(__file__).resolve().parent.parent


def test_bundles_are_packed_first_fit_largest_first_on_the_nodes():
    gpu, cpu = {"CPU": 4, "GPU": 1}, {"CPU": 1}
    assert unplaced([cpu, gpu, cpu], [{"CPU": 8}, {"CPU": 5, "GPU": 1}]) == []
    assert unplaced([gpu, gpu, cpu], [{"CPU": 8}, {"CPU": 5, "GPU": 1}]) == [gpu]
    # enough CPUs in all, but no single node holds a 3-CPU bundle
    assert unplaced([{"CPU": 3}], [{"CPU": 2}, {"CPU": 2}]) == [{"CPU": 3}]
    assert unplaced([{"CPU": 1, "trainer": 0.1}], [{"CPU": 8}]) == [{"CPU": 1, "trainer": 0.1}]
    # CPU-only bundles leave a scarce node's CPUs to the bundle that needs that node, whatever the
    # nodes' order (Ray lists them in no fixed order; test_faults' node run failed on one order)
    gen = {"CPU": 0.5, "gen": 0.1}
    for nodes in ([{"CPU": 1, "gen": 1}, {"CPU": 4}], [{"CPU": 4}, {"CPU": 1, "gen": 1}]):
        assert unplaced([{"CPU": 0.5}, {"CPU": 0.5}, gen], nodes) == []


def test_node_types_of_the_shipped_cluster_yaml():
    """cluster.yaml: a bundle asking for a GPU fits its GPU workers only; one asking for 8 GPUs,
    or a resource no node type has, never fits."""
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
