"""An autoscaling Ray cluster on this machine, from a ``cluster.yaml``-shaped description: a
real head (``ray start --head``, 127.0.0.1, token authentication on) whose real autoscaler (v1,
Ray's default) launches worker nodes with Ray's fake multi-node provider, which starts each as
a raylet on this machine (``ray.autoscaler._private.fake_multi_node``), in the head's temp dir.

Ray's own ``ray.cluster_utils.AutoscalingCluster`` does the same but runs ``ray stop --force``
(every Ray instance of the machine) and binds where Ray's node IP resolves to; this one stops
only its own processes (:func:`tests.ray_instance.stop_instance`).

The description takes what ``cluster.yaml`` says of node types: ``available_node_types`` (each
with ``resources``, ``min_workers``, ``max_workers``), ``head_node_type``, ``max_workers``,
``idle_timeout_minutes``, ``upscaling_speed``; ``node_config`` and the commands are left out
(the fake provider starts nodes itself). The head's type is renamed to the fake provider's
(``ray.head.default``), and the head started with its resources.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.cluster.local_ray import LOOPBACK, LOOPBACK_ENV
from tests.ray_instance import stop_instance
from tests.test_job_submit import Head, _free_port

FAKE_HEAD_TYPE = "ray.head.default"  # ray.autoscaler._private.fake_multi_node.node_provider
NODE_TYPE_KEYS = ("resources", "min_workers", "max_workers")


@dataclass
class Cluster(Head):
    gcs_address: str = ""  # what ray.init(address=...) and ray.address take


def one_worker_type(head_cpus: float, name: str, resources: dict) -> dict:
    """A ``cluster.yaml``-shaped description: a head of ``head_cpus`` CPUs and one worker type,
    ``name``, with ``resources`` at ``min_workers: 0`` and one node at most (its object store kept
    small: the fake node is a real raylet on this machine)."""
    return {
        "max_workers": 1,
        "idle_timeout_minutes": 5,
        "head_node_type": "head.cpu",
        "available_node_types": {
            "head.cpu": {"resources": {"CPU": head_cpus}},
            name: {"resources": {**resources, "object_store_memory": 300 * 2**20}, "min_workers": 0, "max_workers": 1},
        },
    }


def fake_autoscaling_config(description: dict, gcs_address: str) -> dict:
    """The fake multi-node provider's autoscaling config for a ``cluster.yaml``-shaped
    ``description``, its head at ``gcs_address``."""
    head = description["head_node_type"]
    types = {}
    for name, spec in description["available_node_types"].items():
        node = {k: spec[k] for k in NODE_TYPE_KEYS if k in spec}
        types[FAKE_HEAD_TYPE if name == head else name] = {**node, "node_config": {},
                                                           **({"max_workers": 0} if name == head else {})}
    return {
        "cluster_name": description.get("cluster_name", "fake"),
        "max_workers": description.get("max_workers", 2),
        "upscaling_speed": description.get("upscaling_speed", 1.0),
        "idle_timeout_minutes": description.get("idle_timeout_minutes", 5),
        "provider": {"type": "fake_multinode", "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True, "gcs_address": gcs_address},
        "available_node_types": types, "head_node_type": FAKE_HEAD_TYPE,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [], "worker_start_ray_commands": [],
    }


def head_resource_args(resources: dict) -> list[str]:
    """``ray start`` arguments for the head's resources (CPU, GPU, object store, custom)."""
    rest = dict(resources)
    args = []
    for key, flag in (("CPU", "--num-cpus"), ("GPU", "--num-gpus"), ("object_store_memory", "--object-store-memory")):
        if key in rest:
            args += [flag, str(int(rest.pop(key)))]
    return args + (["--resources", json.dumps(rest)] if rest else [])


@contextmanager
def autoscaling_cluster(description: dict) -> Iterator[Cluster]:
    """Start the cluster's head (with its autoscaler) and stop every process of the cluster at
    the end; yields the head (its job API address and a CLI environment that sends the token)."""
    # short: the session folder's unix sockets must fit in 107 bytes
    temp_dir = tempfile.mkdtemp(prefix="gp-as-", dir="/tmp")
    gcs_port, dashboard = _free_port(), _free_port()
    config = fake_autoscaling_config(description, f"{LOOPBACK}:{gcs_port}")
    config_path = Path(temp_dir) / "autoscaling.json"
    config_path.write_text(json.dumps(config))
    env = {**os.environ, **LOOPBACK_ENV, "RAY_AUTH_MODE": "token",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "AUTOSCALER_METRIC_PORT": str(_free_port()), "DASHBOARD_METRIC_PORT": str(_free_port()),
           "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
    env.pop("RAY_ADDRESS", None)
    head = Cluster(temp_dir, f"http://{LOOPBACK}:{dashboard}", env, gcs=f"{LOOPBACK}:{gcs_port}",
                   gcs_address=f"{LOOPBACK}:{gcs_port}")
    head_resources = description["available_node_types"][description["head_node_type"]]["resources"]
    assert head.ray("get-auth-token", "--generate").returncode == 0
    try:
        start = head.ray("start", "--head", "--node-ip-address", LOOPBACK, "--port", str(gcs_port),
                         f"--autoscaling-config={config_path}",
                         "--dashboard-host", LOOPBACK, "--dashboard-port", str(dashboard),
                         "--dashboard-agent-listen-port", str(_free_port()),
                         "--metrics-export-port", str(_free_port()),
                         *head_resource_args(head_resources),
                         "--temp-dir", temp_dir, "--disable-usage-stats", timeout=180)
        assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
        yield head
    finally:
        assert not stop_instance(temp_dir), "processes of the test's cluster survived SIGKILL"
        shutil.rmtree(temp_dir, ignore_errors=True)
