"""``graftpool serve`` on an autoscaling cluster whose GPU workers are gone (``cluster.yaml``:
``min_workers: 0``, taken down ``idle_timeout_minutes`` after the training job), with Ray's real
autoscaler and its fake multi-node provider on this machine (``tests/autoscaling_cluster.py``:
127.0.0.1, token authentication on; the worker type's "GPU" is Ray's bookkeeping, no device).

A run whose replicas ran on GPUs (``models[].generation.num_gpus: 1``) is served from the head:
the driver waits for the autoscaler to add a GPU worker, and the model's deployment asks for
its GPU and runs there. Before, serve looked at the GPUs the cluster had at that moment (none)
and deployed every model on the head's CPUs, in fp32 with the ``hf`` backend."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

from tests.autoscaling_cluster import autoscaling_cluster, one_worker_type
from tests.netcut import free_port
from tests.served_run import served_run_folder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = one_worker_type(2, "worker.gpu", {"CPU": 2, "GPU": 1})


def _run_folder(tmp_path: Path) -> Path:
    """A finished run of one demo model whose replica ran on a GPU: its config and final weights."""
    return served_run_folder(tmp_path, "gpu-run", ["models.0.generation.num_gpus=1", "ray.wait_for_resources_s=300"])


def _actors(cluster) -> list[dict]:
    listed = cluster.ray("list", "actors", "--address", cluster.address, "--format", "json", "--filter",
                         "state=ALIVE", "--limit", "1000")
    assert listed.returncode == 0, listed.stderr[-2000:]
    return json.loads(listed.stdout)


@pytest.mark.slow
def test_serve_waits_for_the_autoscaler_and_runs_a_gpu_trained_model_on_a_gpu_worker(tmp_path):
    run_dir = _run_folder(tmp_path)
    port = free_port()
    with autoscaling_cluster(CLUSTER) as cluster:
        env = {**cluster.env, "RAY_ADDRESS": cluster.gcs_address,
               "GRAFTPOOL_CACHE": os.environ.get("GRAFTPOOL_CACHE") or str(ROOT / ".cache")}
        serving = subprocess.Popen([sys.executable, "-m", "orchestrator", "serve", str(run_dir), "--port", str(port)],
                                   env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        said = []
        watchdog = threading.Timer(900, serving.kill)  # a serve that never says it serves ends the read
        watchdog.start()
        try:
            for line in serving.stdout:  # until it serves, or exits
                said.append(line)
                if line.startswith("serving "):
                    break
            out = "".join(said)
            assert serving.poll() is None, out[-4000:]
            assert "for the autoscaler to add the nodes of the job's bundles: 1 x {CPU: 1, GPU: 1}" in out, out[-4000:]
            url = f"http://127.0.0.1:{port}/v1/completions"
            body = json.dumps({"model": "llama-char", "prompt": "13+29=", "max_tokens": 4, "temperature": 0})
            request = urllib.request.Request(url, body.encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=300) as reply:
                answer = json.loads(reply.read())
            assert len(answer["choices"]) == 1 and answer["usage"]["completion_tokens"] >= 1, answer
            nodes = json.loads(cluster.ray("list", "nodes", "--address", cluster.address, "--format", "json",
                                           "--filter", "state=ALIVE").stdout)
            workers = {n["node_id"] for n in nodes if not n["is_head_node"]}
            replica = [a for a in _actors(cluster) if "model-llama-char" in a["class_name"]]
            assert len(workers) == 1 and len(replica) == 1, (nodes, replica)
            assert replica[0]["node_id"] in workers, "the model's deployment runs on the GPU worker"
        finally:
            watchdog.cancel()
            serving.send_signal(signal.SIGINT)  # serve_forever shuts Serve down
            try:
                serving.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serving.kill()
