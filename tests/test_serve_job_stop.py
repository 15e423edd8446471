"""``graftpool serve`` as a cluster job ends with the job: ``docs/operations.md`` runs it on the
cluster at ``RAY_ADDRESS`` (a ``ray job submit`` job, or ``RAY_ADDRESS=auto`` in a shell on the
head). Ray Serve's applications outlive the driver that deployed them on a cluster (its controller
is a detached actor), and ``serve_forever`` took down Serve on Ctrl-C only; ``ray job stop`` ends a
job with SIGTERM (SIGKILL 3 s later) and a closed SSH session a shell's command with SIGHUP, so the
models' deployments went on holding their GPUs (``cluster.yaml``'s GPU nodes, never idle, never
taken down) and answering on the port after the job said STOPPED.

A real head (``ray start --head`` on 127.0.0.1, token authentication on, as
``tests/test_job_submit.py``), the run folder of one demo model, served by ``ray job submit``;
``ray job stop``; the model's replica actor must be gone."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.served_run import served_run_folder
from tests.test_job_submit import ROOT, Head, _free_port, ray_head  # noqa: F401  (the fixture)

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

WAIT_S = 300.0  # for the deployment to come up, and to go; a bound on a wait, not a timed claim


def _run_folder(tmp_path: Path) -> Path:
    """A finished run of one demo model (CPU): its config and final weights."""
    return served_run_folder(tmp_path, "served")


def _replicas(head: Head) -> list[dict]:
    """The served model's live replica actors, as ``ray list actors`` (with the token) says."""
    listed = head.ray("list", "actors", "--address", head.address, "--format", "json", "--filter",
                      "state=ALIVE", "--limit", "1000")
    assert listed.returncode == 0, listed.stderr[-2000:]
    start = listed.stdout.find("[")  # after any warning line; none listed: no JSON at all
    actors = json.loads(listed.stdout[start:]) if start >= 0 else []
    return [a for a in actors if "model-llama-char" in a["class_name"]]


def _models_listed(port: int) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/v1/models", timeout=10) as reply:
            return [m["id"] for m in json.loads(reply.read())["data"]] == ["llama-char"]
    except (urllib.error.URLError, OSError, ValueError):
        return False


def test_ray_job_stop_of_a_serve_job_takes_its_deployments_down(ray_head, tmp_path):  # noqa: F811
    head = ray_head
    run_dir, port, job_id = _run_folder(tmp_path), _free_port(), f"gp-serve-{uuid.uuid4().hex[:8]}"
    runtime_env = {"env_vars": {"GRAFTPOOL_CACHE": os.environ.get("GRAFTPOOL_CACHE") or str(ROOT / ".cache")}}
    submitted = head.ray("job", "submit", "--no-wait", "--address", head.address, "--submission-id", job_id,
                         "--working-dir", str(ROOT), "--runtime-env-json", json.dumps(runtime_env), "--",
                         sys.executable, "-m", "orchestrator", "serve", str(run_dir), "--port", str(port))
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]

    deadline = time.monotonic() + WAIT_S
    while not (_models_listed(port) and _replicas(head)):  # the state API lags the endpoint
        logs = head.ray("job", "logs", "--address", head.address, job_id)
        assert time.monotonic() < deadline, f"the endpoint never came up:\n{logs.stdout[-4000:]}"
        assert "FAILED" not in head.ray("job", "status", "--address", head.address, job_id).stdout, logs.stdout[-4000:]
        time.sleep(3)

    stopped = head.ray("job", "stop", "--address", head.address, job_id)
    assert stopped.returncode == 0, stopped.stdout[-3000:] + stopped.stderr[-3000:]
    logs = head.ray("job", "logs", "--address", head.address, job_id).stdout
    deadline = time.monotonic() + WAIT_S
    while _replicas(head) and time.monotonic() < deadline:
        time.sleep(3)
    assert _replicas(head) == [], f"the model's deployment outlived `ray job stop`:\n{logs[-3000:]}"
    assert not _models_listed(port), "the endpoint still answers after `ray job stop`"
