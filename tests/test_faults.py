"""Faults, end to end on CPU with real actors: a SIGKILLed driver resumes from its
checkpoint with nothing lost or duplicated and ends where an uninterrupted run ends (bit for
bit); generation, verifier and trainer actors killed through Ray's API mid-run are survived,
again ending exactly where an undisturbed run ends; a trainer node lost from a multi-node
cluster is survived the same way; deaths past ``run.max_step_retries`` fail the run naming
what died. No mocks: the faults are real process deaths.

All runs verify with ``math`` (math-verify), as production does: the verifier actor settles
boxed integers itself and sends everything else to its math-verify child process, which the
verifier-kill test has alive when its actor is killed, and SIGKILLs on its own later."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from orchestrator.cluster.local_ray import instance_pids
from orchestrator.config import load_config
from orchestrator.controller.faults import ActorLost
from orchestrator.controller.loop import Controller
from tests.platform_checks import read_store
from tests.ray_instance import process_alive, stop_instance
from tests.reference_run import DEMO, PAIR, STEPS, assert_same_run, overrides

ROOT = Path(__file__).resolve().parent.parent
REMOVE_AFTER = 1  # the multi-node test removes a trainer node after this step's checkpoint

pytestmark = pytest.mark.slow


# -- a SIGKILLed driver, resumed ----------------------------------------------------------


def _driver(out: Path, ray_env: str) -> subprocess.Popen:
    sets = [arg for s in overrides(out, "killed") for arg in ("--set", s)]
    env = {**os.environ, "RAY_TMPDIR": ray_env, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "orchestrator", "run", str(DEMO), *sets],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkilled_driver_resumes_with_nothing_lost_and_ends_equal(demo_reference, tmp_path, capsys):
    ray_env = tempfile.mkdtemp(prefix="gp-ray-", dir="/tmp")  # short: Ray's socket paths
    ray_tmp = os.path.join(ray_env, "ray")  # RAY_TMPDIR=X: the instance's temp dir is X/ray
    run_dir = tmp_path / "killed"
    try:
        driver = _driver(tmp_path, ray_env)
        deadline = time.monotonic() + 400
        while not (run_dir / "trajectories" / "step_000002.parquet").exists():
            assert driver.poll() is None, driver.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the driver never wrote step 2"
            time.sleep(0.05)
        instance = instance_pids(ray_tmp)
        assert len(instance) > 3, "the driver's own local Ray instance (gcs, raylet, workers)"
        driver.send_signal(signal.SIGKILL)  # mid-run: after step 2's rows, before or after its checkpoint
        driver.wait(30)
        driver.stdout.close()
        orphans = instance_pids(ray_tmp)  # the killed driver's Ray instance, left behind
        assert not stop_instance(ray_tmp), "the killed driver's Ray processes are gone"
        checkpoint = sorted(p.name for p in (run_dir / "checkpoints").glob("step_*"))[-1]
        assert checkpoint in ("step_000001", "step_000002")
        kept = int(checkpoint.split("_")[1])
        written = {p.name: p.stat().st_mtime_ns for p in (run_dir / "trajectories").glob("step_*.parquet")}
        # A new driver resumes the run: this process, on the test session's Ray instance (the
        # CLI's --resume flag, which sets run.resume=true, is driven by the `ray job submit` test)
        Controller(load_config(DEMO, overrides(tmp_path, "killed", [*PAIR, "run.resume=true"]))).run()
        assert f"resumed from {run_dir / 'checkpoints' / checkpoint}" in capsys.readouterr().out
        print(f"SIGKILL after step 2's rows: the driver's Ray instance had {len(instance)} processes, "
              f"{len(orphans)} outlived it and were stopped; "
              f"resumed from {checkpoint}")
    finally:
        stop_instance(ray_tmp)
        shutil.rmtree(ray_env, ignore_errors=True)
    # steps up to the checkpoint were kept as written, later ones written again by the resumed run
    after = {p.name: p.stat().st_mtime_ns for p in (run_dir / "trajectories").glob("step_*.parquet")}
    for name, mtime in written.items():
        assert (after[name] == mtime) == (int(name[5:11]) <= kept), name
    starts = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
              if '"event"' in line]
    assert [s.get("resumed_from_step") for s in starts] == [None, kept]
    assert_same_run(run_dir, demo_reference)
    state = json.loads((run_dir / "checkpoints" / f"step_{STEPS:06d}" / "controller.json").read_text())
    assert state["step"] == STEPS and state["store_steps"] == list(range(1, STEPS + 1))
    mlflow = json.loads((run_dir / "mlflow.json").read_text())
    assert mlflow["parent_run_id"] == json.loads((run_dir / "summary.json").read_text())["mlflow_run_id"]
    client = MlflowClient(tracking_uri=mlflow["tracking_uri"])  # the same runs went on, and ended
    assert client.get_run(mlflow["parent_run_id"]).info.status == "FINISHED"
    assert client.get_run(mlflow["parent_run_id"]).data.params["exchange.name"] == "graft"
    for run_id in mlflow["child_run_ids"].values():
        history = client.get_metric_history(run_id, "train/reward_mean")
        assert {m.step for m in history} == set(range(1, STEPS + 1))


# -- a node lost ---------------------------------------------------------------------------


def test_pair_run_across_nodes_survives_losing_a_trainer_node(tmp_path, demo_reference):
    """Multi-node on one machine: the demo pair's reference run (``tests/reference_run.py``) on a
    ``ray.cluster_utils.Cluster`` (head + three worker nodes, custom resources pinning the gpt2
    model's generation replica to one node and its two trainer ranks to two others, ``placement:
    spread``), with one of those nodes removed after the step-1 checkpoint. The job recovers on the
    nodes left and ends equal to the reference run on one node without any fault: store, evaluation
    responses, metrics and final weights (``tests/cluster_run.py`` drives the cluster in a process of
    its own; everything listens on 127.0.0.1)."""
    out = tmp_path / "multi"
    done = subprocess.run([sys.executable, "-m", "tests.cluster_run", str(out), str(REMOVE_AFTER),
                           *overrides(out, "cluster")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads((out / "result.json").read_text())
    nodes, before, after = result["nodes"], result["before"]["gpt2-bpe"], result["after"]["gpt2-bpe"]

    # before the loss: generation on `gen`, the two ranks on `t1` and `t2`; llama on the head
    assert before["generation"] == [nodes["gen"]]
    assert sorted(before["trainers"]) == sorted([nodes["t1"], nodes["t2"]])
    assert set(result["before"]["llama-char"]["trainers"]) == {result["head"]}
    # after: both ranks on the trainer node left
    assert result["removed_after_step"] == REMOVE_AFTER
    assert after["trainers"] == [nodes["t1"], nodes["t1"]] and after["generation"] == [nodes["gen"]]
    assert result["summary"]["steps"] == STEPS
    assert any(f["kind"] == "trainer" and "gpt2-bpe" in f["actor"] for f in result["summary"]["faults"])

    # the same run as the single-node one without a fault: nothing lost, nothing duplicated
    assert_same_run(out / "cluster", demo_reference)


# -- actors killed through Ray's API --------------------------------------------------------


class FaultyController(Controller):
    """Kills actors through ``ray.kill``: ``kills[step](self)`` as step ``step`` starts (the
    actor it returns; None: the callable did its own killing), and
    trainer rank ``rank`` of ``model`` right after step ``step``'s update was sent to the
    ranks (``train_kill = (model, rank, step)``: it dies during the update, its peer inside
    or on its way to an all_reduce)."""

    def __init__(self, config, kills, train_kill=None):
        super().__init__(config)
        self.kills, self.train_kill, self.current = dict(kills), train_kill, 0

    def start(self, train=True):
        import ray

        from workers.training.trainer import TorchTrainer

        first = super().start(train)
        for actors in self.actors.values():
            def call(method, *args, _send=actors.on_trainers, _actors=actors):
                pending = _send(method, *args)
                if method is TorchTrainer.train and self.train_kill and self.train_kill[::2] == (_actors.name, self.current):
                    ray.kill(_actors.trainers[self.train_kill[1]])
                    self.train_kill = None
                return pending
            actors.on_trainers = call
        return first

    def step(self, step):
        import ray

        self.current = step
        if step in self.kills and (victim := self.kills.pop(step)(self)) is not None:
            ray.kill(victim)
        return super().step(step)


HALF = ("\\boxed{1/2}", "0.5")  # not a plain integer: judged by math-verify in the child process
HANG = ("\\boxed{9^{9^{9^{9}}}}", "1")  # sympy never finishes comparing it (tests/test_verifier.py)


def _math_child(actor) -> int:
    """The pid of the verifier actor's math-verify child, started by judging HALF if need be."""
    import ray

    assert [v.reason for v in ray.get(actor.verify_batch.remote([HALF]))] == ["correct"]
    return ray.get(actor.__ray_call__.remote(lambda self: self._verifier._worker.process.pid))


def test_killed_generation_verifier_and_trainer_actors_are_survived_exactly(demo_reference, tmp_path):
    """Step 2: a generation replica dies; step 3: the verifier actor's process is SIGKILLed while
    its math-verify child is stuck in sympy, and the child must not spin on (its own orphan check,
    workers/verify/math_verifier.py, or Ray's per-worker process-group cleanup where that is on); step 4: the
    new actor's child is SIGKILLed (the actor lives on and starts another, no fault to record),
    then a trainer rank dies during the update."""
    children = {}

    def sigkill_verifier_with_busy_child(c):
        import ray

        actor = c.verifier.actors[0]
        children["orphaned"] = _math_child(actor)
        worker = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))
        actor.verify_batch.remote([HANG])  # killed before its timeout (data.verifier_timeout_s = 2)
        time.sleep(0.5)
        # a real death: ray.kill would run the worker's exit handlers, which stop the child
        os.kill(worker, signal.SIGKILL)
        while process_alive(worker):
            time.sleep(0.05)

    def kill_math_child(c):
        pid = children["killed"] = _math_child(c.verifier.actors[0])
        os.kill(pid, signal.SIGKILL)
        while process_alive(pid):
            time.sleep(0.05)
        assert _math_child(c.verifier.actors[0]) != pid, "the actor judges on with a new child"

    config = load_config(DEMO, overrides(tmp_path, "faults"))
    controller = FaultyController(config, {
        2: lambda c: c.actors["llama-char"].generators[0],
        3: sigkill_verifier_with_busy_child,
        4: kill_math_child,
    }, train_kill=("gpt2-bpe", 1, 4))
    try:
        summary = controller.run()
        orphan_alive = process_alive(children["orphaned"])
    finally:
        for pid in children.values():
            if process_alive(pid):  # never leave one spinning, whatever the outcome
                os.kill(pid, signal.SIGKILL)
    kinds = [(f["kind"], f["step"]) for f in summary["faults"]]
    assert kinds == [("generator", 2), ("verifier", 3), ("trainer", 4)], summary["faults"]
    assert summary["faults"][2]["actor"] == "trainer rank 1 of model gpt2-bpe"
    assert "checkpoint step_000003" in summary["faults"][2]["action"]
    assert not orphan_alive, "the dead verifier actor's math-verify child exits on its own"
    assert children["killed"] != children["orphaned"]
    assert_same_run(tmp_path / "faults", demo_reference)


def test_deaths_past_the_retry_bound_fail_naming_the_actor(tmp_path, ray_local):
    import ray

    data = yaml.safe_load(DEMO.read_text())
    data["models"], data["exchange"] = data["models"][1:], {"name": "none"}  # one model: cheaper
    controller = Controller(load_config(data=data, overrides=overrides(tmp_path, "doomed",
                                                                        ["run.max_step_retries=1"])))

    def always_dead(step):  # every attempt at step 2 finds replica 0 dead
        if step == 2:
            ray.kill(controller.actors["gpt2-bpe"].generators[0])
        return Controller.step(controller, step)

    controller.step = always_dead
    with pytest.raises(ActorLost, match=r"step 2: generation replica 0 of model gpt2-bpe died .*"
                                        r"giving up after 1 retries \(run.max_step_retries = 1\)"):
        controller.run()
    assert [f["kind"] for f in controller.state.faults] == ["generator"]  # one survived, the second fatal
    assert {r["step"] for r in read_store(tmp_path / "doomed")} == {1}, "nothing of the failed step"


def test_a_dead_trainer_without_checkpoints_or_snapshots_fails_naming_it(tmp_path, ray_local):
    data = yaml.safe_load(DEMO.read_text())
    data["models"], data["exchange"] = data["models"][:1], {"name": "none"}
    config = load_config(data=data, overrides=overrides(tmp_path, "nockpt", ["run.checkpoint_every=0",
                                                                             "run.step_snapshot=off"]))
    controller = FaultyController(config, {2: lambda c: c.actors["llama-char"].trainers[0]})
    with pytest.raises(ActorLost, match=r"trainer rank 0 of model llama-char died at step 2 .*"
                                        r"no checkpoint or step snapshot to restore it from "
                                        r"\(run.checkpoint_every = 0, run.step_snapshot = off\); "
                                        r"the run has no checkpoint to go on from yet: --resume would start it again "
                                        r"at step 1, its step files dropped \(run.checkpoint_every keeps checkpoints\)"):
        controller.run()
    assert {r["step"] for r in read_store(tmp_path / "nockpt")} == {1}
