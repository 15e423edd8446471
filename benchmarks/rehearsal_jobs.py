"""The rehearsal's client side (``make rehearsal``): ``ray job submit`` as a user types it, the
job's status, the cluster's actors as ``ray list`` shows them, the peak memory of each actor's
process, and the SIGKILL of one trainer rank. Everything goes through the real CLI with the
cluster's token (the head's ``env``); the processes are on this machine, so a pid from ``ray
list actors`` is one here."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.test_job_submit import Head

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def snapshot(dest: Path) -> Path:
    """A copy of the checkout as git sees it (tracked and untracked files, not the ignored ones),
    with its .gitignore and .rayignore: every job uploads this one, so that they all run the same
    code (and the same package, which Ray names by its hash) even while the checkout is edited."""
    import shutil
    import subprocess

    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    skipped = tuple(line.strip() for line in (ROOT / ".rayignore").read_text().splitlines()
                    if line.strip().endswith("/") and not line.startswith("#"))  # never uploaded
    for name in filter(None, files):
        source = ROOT / name
        if name.startswith(skipped):
            continue
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def submit(head: Head, job_id: str, entrypoint: list[str], env_vars: dict[str, str], working_dir: Path) -> None:
    """``ray job submit --no-wait --working-dir <checkout>``: the checkout is uploaded as a user's
    would be (.gitignore and .rayignore leave out .venv, .cache, runs, the benchmark results);
    retried while the head's job agent is still starting."""
    runtime_env = json.dumps({"env_vars": env_vars})
    for _ in range(40):
        proc = head.ray("job", "submit", "--address", head.address, "--submission-id", job_id, "--no-wait",
                        "--working-dir", str(working_dir), "--runtime-env-json", runtime_env, "--", *entrypoint)
        out = proc.stdout + proc.stderr
        if proc.returncode == 0:
            return
        if "No available agent" not in out:
            raise RuntimeError(f"ray job submit failed:\n{out[-3000:]}")
        time.sleep(3)
    raise RuntimeError(f"the head's job agent never came up:\n{out[-3000:]}")


def status(head: Head, job_id: str) -> str:
    """The job's status word (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    out = head.ray("job", "status", "--address", head.address, job_id)
    text = out.stdout + out.stderr
    for word in ("SUCCEEDED", "FAILED", "STOPPED", "RUNNING", "PENDING"):
        if word.lower() in text.lower():
            return word
    return "UNKNOWN"


def wait(head: Head, job_id: str, timeout_s: float, poll_s: float = 5.0) -> str:
    """Wait for the job to end; its final status."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = status(head, job_id)
        if state in TERMINAL:
            return state
        time.sleep(poll_s)
    raise TimeoutError(f"job {job_id} did not end within {timeout_s:.0f} s")


def logs(head: Head, job_id: str) -> str:
    """The job's whole log (what ``ray job submit`` would have followed)."""
    out = head.ray("job", "logs", "--address", head.address, job_id)
    return out.stdout + out.stderr


@dataclass(frozen=True)
class Actor:
    """A live actor of the cluster: its class, pid, node and model (its placement group's name,
    ``graftpool-<model>``; empty for the verifiers, which have none)."""

    class_name: str
    pid: int
    node_id: str
    model: str


def listed(head: Head, kind: str) -> list[dict]:
    """``ray list <kind> --detail`` as records."""
    out = head.ray("list", kind, "--address", head.address, "--format", "json", "--limit", "1000", "--detail")
    if out.returncode != 0:
        raise RuntimeError(f"ray list {kind} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def head_node_id(head: Head) -> str:
    """The id of the cluster's head node."""
    return next(n["node_id"] for n in listed(head, "nodes") if n.get("is_head_node"))


def actors(head: Head) -> list[Actor]:
    """The cluster's live actors (``ray list actors`` and ``ray list placement-groups``)."""

    groups = {g["placement_group_id"]: g.get("name", "") for g in listed(head, "placement-groups")}
    found = []
    for a in listed(head, "actors"):
        if a.get("state") != "ALIVE" or not a.get("pid"):
            continue
        group = groups.get(a.get("placement_group_id") or "", "")
        found.append(Actor(a["class_name"], int(a["pid"]), a.get("node_id", ""),
                           group.removeprefix("graftpool-")))
    return found


def peak_rss_mib(pid: int) -> float | None:
    """The process's peak resident set (VmHWM) in MiB; None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


@dataclass(eq=False)  # a thread: hashed by identity
class MemoryWatch(threading.Thread):
    """Beside a job: lists the cluster's actors every ``list_every_s`` and reads each one's peak
    RSS every ``poll_s``, keeping the largest seen per actor (pid)."""

    head: Head
    poll_s: float = 2.0
    list_every_s: float = 20.0
    peaks: dict[int, tuple[Actor, float]] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        known: list[Actor] = []
        listed_at = 0.0
        while not self.done.is_set():
            if time.monotonic() - listed_at > self.list_every_s:
                try:
                    known = actors(self.head)
                except (RuntimeError, json.JSONDecodeError):
                    pass  # the head is busy; the next round lists again
                listed_at = time.monotonic()
            for actor in known:
                rss = peak_rss_mib(actor.pid)
                if rss is not None and rss > self.peaks.get(actor.pid, (actor, 0.0))[1]:
                    self.peaks[actor.pid] = (actor, rss)
            self.done.wait(self.poll_s)


def kill_trainer_rank(head: Head, model: str, rank_pick: int = 1) -> Actor:
    """SIGKILL one trainer rank of ``model`` (the ``rank_pick``-th of its live trainer actors, by
    pid): a process this rehearsal's cluster started, found by ``ray list actors``."""
    ranks = sorted((a for a in actors(head) if "Trainer" in a.class_name and a.model == model),
                   key=lambda a: a.pid)
    if not ranks:
        raise RuntimeError(f"no live trainer rank of {model} to kill")
    victim = ranks[min(rank_pick, len(ranks) - 1)]
    os.kill(victim.pid, signal.SIGKILL)
    return victim
