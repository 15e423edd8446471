"""``make rehearsal``: issue #51's GPU-cluster run rehearsed on CPU, as a user submits it.

An autoscaling Ray cluster on this machine (``tests.autoscaling_cluster``: a real head on
127.0.0.1 with token authentication and Ray's real autoscaler, whose fake multi-node provider
starts worker nodes as raylets here) from a ``cluster.yaml``-shaped description: a head with 2
CPUs for the driver and the verifier, and a worker node type at ``min_workers: 0`` that alone
offers the ``rehearsal_worker`` resource every model actor's bundle asks for (as GPUs are only on
``cluster.yaml``'s workers), so the job waits for the autoscaler to add it. Three jobs of
``configs/rehearsal_cpu.yaml`` (SmolLM2-135M-Instruct and a 106 M-parameter gpt2 with its own BPE
vocabulary, both on vLLM, each trained by DeepSpeed ZeRO-2 over 2 ranks, bf16 syncs, a parquet
math set with long responses), each ``ray job submit --working-dir <checkout>`` with the scale
environment's ``python`` (the cluster's nodes run it, as ``cluster.yaml``'s nodes run their
venv):

1. reference: 3 steps, uninterrupted, checkpoints and store in its own ``run.storage``;
2. chaos: the same config with another ``run.storage``; once step 1's checkpoint is there, one
   trainer rank is SIGKILLed (by pid, from ``ray list actors``); ``run.max_step_retries: 0`` in
   every job, so the death fails the job, as a death past the retries does;
3. the chaos job resubmitted with ``--resume``: its run folder is relative (``runs``) in a fresh
   upload of the checkout, so it finds no checkpoint there and downloads the latest from
   ``run.storage``, as a re-submitted job on another node does.

In every job the driver works in a folder of its own in the copy (``driver/``), the actors in the
copy's root: the relative run folder is two folders, as on a head and a worker that share no disk,
so the trainer ranks' checkpoint shards and final models pass through the driver
(``orchestrator.controller.node_layout``). The model folders stay on one disk (the fake nodes are
one machine): their shipping is tested in ``tests/test_model_files.py``.

Then the two stores must be identical, step by step. Recorded: each job's wall time, the peak
RSS (VmHWM) of every actor process, bytes per weight sync (each model's state dict at the sync
dtype, a tied head under both its names, as the sync sends it) and the run's own step times: ``benchmarks/results/rehearsal.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks.rehearsal_data import write_math_parquet
from benchmarks.rehearsal_jobs import (
    TERMINAL,
    MemoryWatch,
    head_node_id,
    kill_trainer_rank,
    logs,
    snapshot,
    status,
    submit,
    wait,
)
from tests.autoscaling_cluster import Cluster, autoscaling_cluster

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/rehearsal_cpu.yaml"  # relative: the job reads it in its uploaded copy
RUN = "rehearsal"
DRIVER_FOLDER = "driver"  # the driver's working folder inside the job's copy; the actors work in the copy's root
JOB_TIMEOUT_S = 1500

# Each node's object store: Ray's default is 30% of the machine's memory a node, and the two nodes
# here share one machine's 23.5 GiB, so their stores alone could take 60% of it, where on a
# cluster each node's store is 30% of its own. Their raylets reached 3.3 GiB each in the jobs,
# and with them the jobs' processes reached 22.1-22.6 of 23.54 GB: Ray's memory monitor killed
# workers at step 1 or 2 (twice at eb92b4f, once at 7cbff40, which had passed). The largest
# objects are 64 MiB file chunks and a model's bf16 weights (270 MB); more spills to disk.
NODE_OBJECT_STORE = 2 * 2**30

DESCRIPTION = {  # cluster.yaml's node-type section, sized for this machine
    "cluster_name": "rehearsal",
    "max_workers": 1,
    "idle_timeout_minutes": 10,
    "upscaling_speed": 1.0,
    "head_node_type": "head.cpu",
    "available_node_types": {
        "head.cpu": {"resources": {"CPU": 2, "object_store_memory": NODE_OBJECT_STORE}},
        "worker.models": {"min_workers": 0, "max_workers": 1,
                          "resources": {"CPU": 6, "rehearsal_worker": 1, "object_store_memory": NODE_OBJECT_STORE}},
    },
}


def entrypoint(data: Path, storage: Path, output_dir: str, resume: bool) -> list[str]:
    """The job's command: the node's ``python`` (first on the cluster's PATH: the scale env).
    ``output_dir`` is relative, in the job's unpacked copy of the checkout. Jobs that upload the
    same checkout share that copy on a node (Ray names it by the upload's hash), so each job here
    has its own: the resumed one finds no checkpoint of the killed one there, as on a head that
    never ran it, and must fetch it from ``run.storage``."""
    sets = [f"data.train.path={data}", f"run.storage={storage.as_uri()}", f"run.output_dir={output_dir}",
            "run.max_step_retries=0"]
    command = ["python", "-m", "orchestrator", "run", f"../{CONFIG}", *(["--resume"] if resume else []),
               *[arg for s in sets for arg in ("--set", s)]]
    # The driver works in a folder of its own (DRIVER_FOLDER), the actors in the copy's root: the
    # relative run folder is two folders, as on a head and a worker that share no disk (fake nodes
    # share one machine, so an absolute path would be one folder for both).
    return ["sh", "-c", f'mkdir -p {DRIVER_FOLDER} && PYTHONPATH="$PWD${{PYTHONPATH:+:$PYTHONPATH}}" && '
            f'export PYTHONPATH && cd {DRIVER_FOLDER} && exec {shlex.join(command)}']


# A task on the worker node type, from a job with the same uploaded checkout: the autoscaler adds
# the worker node for it, and that node's runtime-env agent unpacks the checkout. Fake nodes share
# the head's session folder, so that agent unpacks it where the head's copy is (Ray's working_dir
# plugin removes and unpacks again): a driver already running in that copy would lose its cwd.
# After this job both agents hold the package, and the rehearsal's jobs run in one copy that stays.
WARM_UP = ("import ray; ray.init(); "
           "print(ray.get(ray.remote(num_cpus=0, resources={'rehearsal_worker': 0.01})"
           "(lambda: 'worker node up').remote()))")


def run_job(head: Cluster, name: str, command: list[str], env: dict[str, str], kill_after: Path | None,
            kill_model: str, checkout: Path) -> dict:
    """Submit one job and follow it to its end (killing a trainer rank of ``kill_model`` once
    ``kill_after`` exists); its id, status, wall time, actors' peak RSS and the killed rank."""
    job_id = f"{name}-{uuid.uuid4().hex[:8]}"
    watch = MemoryWatch(head)
    start = time.monotonic()
    submit(head, job_id, command, env, checkout)
    watch.start()
    killed = None
    if kill_after is not None:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not kill_after.exists():
            if time.monotonic() > deadline or status(head, job_id) in TERMINAL:
                raise RuntimeError(f"job {job_id} ended or timed out before {kill_after} appeared:\n"
                                   f"{logs(head, job_id)[-3000:]}")
            time.sleep(2)
        time.sleep(5)  # into step 2
        victim = kill_trainer_rank(head, kill_model)
        killed = {"model": victim.model, "class": victim.class_name, "pid": victim.pid,
                  "after_s": round(time.monotonic() - start, 1)}
        print(f"[rehearsal] SIGKILL trainer rank of {victim.model} (pid {victim.pid})", flush=True)
    state = wait(head, job_id, JOB_TIMEOUT_S)
    wall = time.monotonic() - start
    watch.done.set()
    watch.join()
    log = logs(head, job_id)
    (ROOT / "runs").mkdir(exist_ok=True)
    (ROOT / "runs" / f"rehearsal-{name}.log").write_text(log)
    print(f"[rehearsal] job {name}: {state} in {wall:.0f} s", flush=True)
    on_head = head_node_id(head)
    peaks = [{"model": a.model or "-", "class": a.class_name, "pid": pid, "on_head": a.node_id == on_head,
              "peak_rss_mib": round(rss)} for pid, (a, rss) in sorted(watch.peaks.items())]
    return {"job_id": job_id, "status": state, "wall_s": round(wall, 1), "peaks": peaks, "killed": killed,
            "log": log, "log_tail": log[-1500:]}


def stores_identical(a: Path, b: Path) -> dict:
    """Step by step, whether the two trajectory stores hold equal tables."""
    steps_a = sorted(p.name for p in a.glob("step_*.parquet"))
    steps_b = sorted(p.name for p in b.glob("step_*.parquet"))
    equal = {s: pq.read_table(a / s).equals(pq.read_table(b / s)) for s in steps_a if s in steps_b}
    return {"steps_reference": steps_a, "steps_resumed": steps_b, "equal": equal,
            "identical": steps_a == steps_b and bool(equal) and all(equal.values())}


def sync_bytes(final: Path) -> dict[str, int]:
    """Per model, the bytes one weight sync sends: the plan of its state dict at 2 bytes an element
    (bf16, the sync dtype generation.sync_dtype auto picks for a bf16-mixed DeepSpeed trainer),
    ``sum over state-dict names of numel x 2``, as both trainers hand it to the sync
    (``module.state_dict()``): a tied LM head is sent under its own name too, though the exported
    folder holds it once, so counting the folder's tensors left it out (SmolLM2: 54 MiB)."""
    import torch
    from transformers import AutoModelForCausalLM

    from workers.rollout.weight_sync import make_plan

    out = {}
    for model in sorted(p for p in final.iterdir() if p.is_dir()):
        state = AutoModelForCausalLM.from_pretrained(model, torch_dtype=torch.bfloat16).state_dict()
        out[model.name] = make_plan(state).nbytes
    return out


def available_gib() -> float:
    """MemAvailable of this machine, GiB (the jobs' actors take about 11 GiB together)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/graftpool-rehearsal"),
                        help="the data file and the two runs' storage (every fake node sees it)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "rehearsal.json")
    parser.add_argument("--kill-model", default="gpt2-bpe-100m")
    args = parser.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    checkout = snapshot(args.work / "checkout")
    data = write_math_parquet(args.work / "data" / "math.parquet", rows=64)
    ref_storage, chaos_storage = args.work / "storage-reference", args.work / "storage-chaos"
    # the zoo and GGUF conversions already built in this checkout's cache (an absolute path)
    env = {"GRAFTPOOL_CACHE": os.environ.get("GRAFTPOOL_CACHE", str(ROOT / ".cache"))}
    load = os.getloadavg()
    t0 = time.monotonic()
    result: dict = {"load_at_start": [round(x, 1) for x in load], "python": sys.executable,
                    "mem_available_gib_at_start": round(available_gib(), 1)}
    with autoscaling_cluster(DESCRIPTION) as head:
        result["warm_up"] = run_job(head, "warm-up", ["python", "-c", WARM_UP], env, None, args.kill_model, checkout)
        result["reference"] = run_job(head, "reference", entrypoint(data, ref_storage, "runs/reference", False), env, None,
                                      args.kill_model, checkout)
        result["chaos"] = run_job(head, "chaos", entrypoint(data, chaos_storage, "runs/chaos", False), env,
                                  chaos_storage / RUN / "checkpoints" / "step_000001", args.kill_model, checkout)
        result["resumed"] = run_job(head, "resumed", entrypoint(data, chaos_storage, "runs/resumed", True), env, None,
                                    args.kill_model, checkout)
    result["total_s"] = round(time.monotonic() - t0, 1)
    result["load_at_end"] = [round(x, 1) for x in os.getloadavg()]
    result["store"] = stores_identical(ref_storage / RUN / "trajectories", chaos_storage / RUN / "trajectories")
    result["sync_bytes"] = sync_bytes(ref_storage / RUN / "final")
    summary = json.loads((ref_storage / RUN / "summary.json").read_text())
    result["mean_step_time_reference"] = {"total": summary["mean_step_total"], **summary["mean_step_time"]}
    jobs = [result[name] for name in ("reference", "chaos", "resumed")]
    result["checks"] = {
        "statuses": [job["status"] for job in jobs] == ["SUCCEEDED", "FAILED", "SUCCEEDED"],
        "store_identical": result["store"]["identical"],
        # the resubmitted job found nothing in its own run folder and fetched the checkpoint
        "resumed_from_storage": "checkpoint of step 1 downloaded from" in result["resumed"]["log"],
        "model_actors_on_the_worker_node": all(not p["on_head"] for job in jobs for p in job["peaks"]
                                               if p["model"] != "-"),
        "tracking_reachable": not any("unreachable" in job["log"] for job in jobs),
        # the trainer ranks did not see the driver's run folder: shards and exports went through it
        "run_folder_not_shared": all("trainer ranks on" in job["log"] and "pass through the driver" in job["log"]
                                     for job in jobs),
    }
    for job in jobs:
        del job["log"]
    ok = all(result["checks"].values())
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("total_s", "checks", "sync_bytes")}, indent=1))
    print(f"[rehearsal] {'PASSED' if ok else 'FAILED'}: {args.out}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
