"""A shell on a node of ``cluster.yaml`` joins the cluster's Ray: what ``docs/operations.md`` has a
user run on the head after a job (``RAY_ADDRESS=auto python -m orchestrator serve RUN_DIR``, ``eval``).

The cluster requires Ray's token (``ray start`` under ``RAY_AUTH_MODE=token``), and a client sends
it only with ``RAY_AUTH_MODE=token`` in its own environment; a login shell on a node has what the
setup commands put in its ``~/.bashrc``. Here those commands write a ``.bashrc`` of their own, and a
driver with that shell's environment joins a real token-authenticated head on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cluster.local_ray import LOOPBACK_ENV
from tests.test_job_submit import Head, ray_head  # noqa: F401 - the fixture

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def login_shell_variables(home: Path, names: tuple[str, ...]) -> dict[str, str]:
    """``names`` as a login shell on a ``cluster.yaml`` node has them: the setup commands that
    write ``~/.bashrc`` run with ``home`` as HOME, then the shell sources it (its venv, absent
    here, fails quietly)."""
    (home / ".bashrc").touch()
    setup = yaml.safe_load((ROOT / "cluster.yaml").read_text())["setup_commands"]
    env = {"PATH": os.environ["PATH"], "HOME": str(home)}
    for command in [c for c in setup if ".bashrc" in c]:
        subprocess.run(["bash", "-c", command], env=env, check=True)
    script = "source ~/.bashrc >/dev/null 2>&1; " + "; ".join(f'echo "{n}=${{{n}-}}"' for n in names)
    out = subprocess.run(["bash", "-c", script], env=env, check=True, capture_output=True, text=True).stdout
    return {name: value for name, _, value in (line.partition("=") for line in out.splitlines()) if value}


def test_a_shell_on_a_cluster_node_joins_the_token_authenticated_cluster(ray_head: Head, tmp_path):  # noqa: F811
    shell = login_shell_variables(tmp_path, ("RAY_AUTH_MODE",))
    env = {key: value for key, value in os.environ.items() if key not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    env |= {**LOOPBACK_ENV, **shell, "RAY_ADDRESS": ray_head.gcs}
    joined = subprocess.run([sys.executable, "-c", "import ray; ray.init(log_to_driver=False); "
                             "print('CPU', ray.cluster_resources()['CPU'])"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert joined.returncode == 0 and "CPU 4.0" in joined.stdout, joined.stderr[-1500:]
