"""``ray job submit`` end to end: a real head started with ``ray start --head`` on 127.0.0.1
(token authentication on), and a job, from an uploaded working dir, that resumes a run from
``run.storage``: step 1 of one model of the demo config was trained in-process (a driver on the
test's own Ray instance) with its checkpoint and store in ``run.storage``; the job, in a working
copy that holds nothing of it, downloads that checkpoint, trains step 2 and ends. One model: the
job path is under test, not the exchange, which the in-process pair runs cover. Its status and
its summary.json are read back. The config's tracking URI carries a password and points at a
dead loopback port: the job trains on (metrics kept locally), and neither its logs (what
``ray job submit`` follows, and every log file of the head) nor its run folder holds the
password. Only that head is stopped: ``ray stop`` would stop every Ray instance on the
machine."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from orchestrator.cluster.local_ray import (
    LOOPBACK,
    LOOPBACK_ENV,
    instance_pids,
    is_loopback,
    listening_sockets,
)
from orchestrator.config import load_config
from orchestrator.controller.loop import Controller
from tests.ray_instance import stop_instance

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")]

ROOT = Path(__file__).resolve().parent.parent
RAY = str(Path(sys.executable).with_name("ray"))  # the venv's CLI: its python runs the workers
SECRET = "s3cret"
JOB_TIMEOUT_S = 600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


@dataclass
class Head:
    temp_dir: str
    address: str  # the job API, http://127.0.0.1:<dashboard port>
    env: dict[str, str]  # for CLI clients: RAY_AUTH_MODE=token makes them send the token
    gcs: str  # the cluster address a driver joins (RAY_ADDRESS), 127.0.0.1:<port>

    def ray(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([RAY, *args], env=self.env, cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout)


@pytest.fixture
def ray_head() -> Iterator[Head]:
    # Short: the session folder's unix sockets must fit in 107 bytes, tmp_path's would not.
    temp_dir = tempfile.mkdtemp(prefix="gp-job-", dir="/tmp")
    env = {**os.environ, **LOOPBACK_ENV, "RAY_AUTH_MODE": "token",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           # fixed by default (44217, 44227): another instance on the machine may hold them
           "AUTOSCALER_METRIC_PORT": str(_free_port()), "DASHBOARD_METRIC_PORT": str(_free_port())}
    env.pop("RAY_ADDRESS", None)
    dashboard, gcs = _free_port(), _free_port()
    head = Head(temp_dir, f"http://{LOOPBACK}:{dashboard}", env, f"{LOOPBACK}:{gcs}")
    # ray start --head enables token auth only if a token exists; RAY_AUTH_MODE=token
    # requires one. This makes it if missing (and prints it: captured, not shown).
    assert head.ray("get-auth-token", "--generate").returncode == 0
    try:
        start = head.ray("start", "--head", "--node-ip-address", LOOPBACK,
                         "--port", str(gcs),
                         "--dashboard-host", LOOPBACK, "--dashboard-port", str(dashboard),
                         "--dashboard-agent-listen-port", str(_free_port()),
                         "--metrics-export-port", str(_free_port()),
                         "--num-cpus", "4", "--temp-dir", temp_dir, "--disable-usage-stats",
                         timeout=180)
        assert start.returncode == 0, start.stdout[-3000:] + start.stderr[-3000:]
        yield head
    finally:
        assert not stop_instance(temp_dir), "processes of the test's head survived SIGKILL"
        shutil.rmtree(temp_dir, ignore_errors=True)


def _submit(head: Head, job_id: str, runtime_env: dict, entrypoint: list[str]) -> str:
    """Submit and follow the job's logs to its end; retried while the node's agent (which
    runs the job) is still starting. Returns the CLI's output."""
    for _ in range(20):
        proc = head.ray("job", "submit", "--address", head.address, "--submission-id", job_id,
                        "--working-dir", str(ROOT), "--runtime-env-json", json.dumps(runtime_env),
                        "--", *entrypoint, timeout=JOB_TIMEOUT_S)
        out = proc.stdout + proc.stderr
        if "No available agent" not in out:
            return out
        time.sleep(3)
    raise AssertionError(f"the job agent never came up:\n{out[-3000:]}")


def test_the_repository_uploads_as_a_working_dir_under_rays_limit():
    """What ``ray job submit --working-dir .`` (the README's command) packs: Ray's own walk of
    the tree, with .gitignore and .rayignore applied. The committed benchmark results alone are
    over Ray's 100 MiB limit for an uploaded working dir, so .rayignore must keep them out."""
    from ray._private.runtime_env.packaging import _dir_travel, _get_excludes

    packed: list[Path] = []
    _dir_travel(ROOT, [_get_excludes(ROOT, [])], lambda path: packed.append(path) if path.is_file() else None,
                include_gitignore=True)
    size_mib = sum(path.stat().st_size for path in packed) / 2**20
    assert size_mib < 20, f"the working dir packs {size_mib:.0f} MiB: add the bulk to .rayignore"
    assert (ROOT / "orchestrator" / "__main__.py") in packed
    assert not [path for path in packed if path.relative_to(ROOT).parts[:2] == ("benchmarks", "results")]


def test_job_submit_resumes_a_run_from_storage_and_trains_on(ray_head, ray_local, tmp_path):
    head = ray_head
    # Every listener of the head is on loopback (checked before the job: its workers too).
    found = listening_sockets(instance_pids(head.temp_dir))
    assert {"gcs_server", "raylet"} <= {name for *_, name in found}, found
    assert [s for s in found if not is_loopback(s[1])] == []

    # The job API refuses a request without the token.
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy hop
    with pytest.raises(urllib.error.HTTPError) as refused:
        direct.open(f"{head.address}/api/jobs/", timeout=30)
    assert refused.value.code in (401, 403)

    name, job_id = "jobsubmit", f"gp-{uuid.uuid4().hex[:12]}"
    # Everything durable is in run.storage, a file:// URI outside any working directory.
    shared = tmp_path / "shared"
    out_dir = shared
    # The password is in the config file, not on the command line: Ray writes the entrypoint
    # into the job's log itself ("Running entrypoint for job ...").
    dead = _free_port()  # nothing listens there: the tracker warns, training goes on
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["tracking"] = {"uri": f"http://alice:{SECRET}@{LOOPBACK}:{dead}"}
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["verifier_actors"] = 1
    # key order kept: the zoo model's cache key follows its sft_tasks' order, and a sorted dump
    # named a model `make models` had not built (in CI the in-process step 1 trained it: 60 s)
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    sets = ["run.eval_every=0", f"run.name={name}", f"run.storage={shared.as_uri()}",
            "run.checkpoint_every=1", "algorithm.prompt_batch=8", "eval.max_prompts=4", "eval.samples=2"]

    # Step 1, in-process, in a run folder the job never sees.
    Controller(load_config(tmp_path / "job.yaml", [*sets, "run.steps=1",
                                                   f"run.output_dir={tmp_path / 'first'}"])).run()
    store = out_dir / name / "trajectories"
    step1 = (store / "step_000001.parquet").read_bytes()

    runtime_env = {
        # The job runs in an uploaded copy of ROOT, packed as the README's command packs it
        # (.gitignore and .rayignore leave out .git, .venv, .cache, runs, the benchmark results):
        # an absolute cache reuses the zoo models already built, instead of building anew.
        "env_vars": {"GRAFTPOOL_CACHE": str(ROOT / ".cache")},
    }
    # The run folder is relative: it lives in the job's uploaded working copy, where nothing of
    # step 1 is. The job finds no local checkpoint, downloads step 1's from run.storage and goes on
    # (--resume: the CLI's flag for a re-submitted job).
    entrypoint = [sys.executable, "-m", "orchestrator", "run", str(tmp_path / "job.yaml"), "--resume",
                  *[arg for s in [*sets, "run.steps=2", "run.output_dir=runs"] for arg in ("--set", s)]]
    out = _submit(head, job_id, runtime_env, entrypoint)
    status = head.ray("job", "status", "--address", head.address, job_id)
    assert f"Job '{job_id}' succeeded" in status.stdout + status.stderr, out[-4000:]
    assert f"{name}: checkpoint of step 1 downloaded from" in out and "resumed from" in out, out[-4000:]
    # The same through the job API, with the token (the request above without it failed).
    token = head.ray("get-auth-token").stdout.strip()
    request = urllib.request.Request(f"{head.address}/api/jobs/{job_id}",
                                     headers={"Authorization": f"Bearer {token}"})
    with direct.open(request, timeout=30) as reply:
        assert json.loads(reply.read())["status"] == "SUCCEEDED"

    summary = json.loads((out_dir / name / "summary.json").read_text())
    assert summary["run"] == name and summary["steps"] == 2
    assert set(summary["models"]) == {"llama-char"}
    for model in summary["models"].values():
        assert set(model["final_pass@1"]) == {"add", "sub", "mod", "digits", "linear", "avg"}
        assert all(0.0 <= v <= 1.0 for v in model["final_pass@1"].values())
        assert set(model["exchange"]) == {"all_fail", "received", "given", "prompts"}
    assert set(summary["mean_step_time"]) == {"generate", "verify", "route", "score", "train", "sync"}
    assert (out_dir / name / "final" / "llama-char").is_dir()
    assert sorted(p.name for p in store.iterdir()) == ["step_000001.parquet", "step_000002.parquet"]
    assert (store / "step_000001.parquet").read_bytes() == step1  # step 1 was not trained again
    assert sorted(p.name for p in (out_dir / name / "checkpoints").iterdir()) == ["step_000001", "step_000002"]

    # The tracker's warning is in the job's log, naming the server but not the password.
    assert f"MLflow tracking at ***@{LOOPBACK}:{dead} is unreachable" in out, out[-4000:]
    logs = Path(head.temp_dir) / "session_latest" / "logs"
    leaks = [p for p in [*logs.rglob("*"), *(out_dir / name).rglob("*")]
             if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert SECRET not in out, [line for line in out.splitlines() if SECRET in line]
    assert leaks == [], leaks
