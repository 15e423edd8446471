"""Deaths outside a step, end to end on CPU with real actors: a replica SIGKILLed while the run
recovers from a killed trainer rank; the run ends equal to the uninterrupted reference run
(``tests/reference_run.py``). A generation replica and a trainer rank SIGKILLed while still in
``__init__`` (before step 1) are in ``tests/test_restart_one.py``. An actor that dies every time it
is started stops the run, within ``run.max_restarts``, with one line naming the actor, the phase
and how to resume. A worker that Ray's memory monitor killed (an ``OutOfMemoryError``, naming no
actor) is told apart too."""

from __future__ import annotations

import os
import signal
import time

import pytest
import ray
import yaml

from orchestrator.cli import main
from orchestrator.config import load_config
from orchestrator.controller import loop
from orchestrator.controller.loop import Controller
from tests.ray_instance import process_alive
from tests.reference_run import DEMO, assert_same_run, overrides

pytestmark = pytest.mark.slow


def _actor_info(actor) -> dict:
    """Ray's GCS record of the actor: its state and its worker's pid (known during ``__init__``)."""
    return ray._private.state.state.actor_table(actor._actor_id.hex())


def _sigkill(actor, deadline_s: float = 60.0) -> str:
    """SIGKILL the actor's process (its pid from Ray) and wait until it is gone; returns the
    actor's state at the kill (PENDING_CREATION: still in ``__init__``)."""
    deadline = time.monotonic() + deadline_s
    while not (info := _actor_info(actor)).get("Pid"):
        assert time.monotonic() < deadline, "Ray never gave the actor a process"
        time.sleep(0.01)
    os.kill(info["Pid"], signal.SIGKILL)
    while process_alive(info["Pid"]):
        time.sleep(0.02)
    return info["State"]


class KilledDuringRecovery(Controller):
    """Trainer rank 1 of gpt2-bpe is SIGKILLed as step 3 starts; while the run goes back to
    checkpoint step 2, right after the new ranks joined, replica 0 of llama-char is SIGKILLed."""

    def __init__(self, config):
        super().__init__(config)
        self.killed: list[str] = []

    def step(self, step):
        if step == 3 and not self.killed:
            self.killed.append(_sigkill(self.actors["gpt2-bpe"].trainers[1]))
        return super().step(step)

    def record_placement(self):
        if len(self.killed) == 1 and self.state.faults and self.state.faults[-1]["kind"] == "trainer":
            self.killed.append(_sigkill(self.actors["llama-char"].generators[0]))
        super().record_placement()


def test_a_replica_killed_during_a_trainer_recovery_is_survived(demo_reference, tmp_path):
    t0 = time.monotonic()
    summary = KilledDuringRecovery(load_config(DEMO, overrides(tmp_path, "recovery"))).run()
    print(f"run with a trainer killed, then a replica during its recovery: {time.monotonic() - t0:.1f} s")
    assert summary["faults"][0]["actor"] == "trainer rank 1 of model gpt2-bpe"
    assert "checkpoint step_000002" in summary["faults"][0]["action"]
    faults = [(f["kind"], f["step"], f["phase"]) for f in summary["faults"]]
    assert faults == [("trainer", 3, "step 3"),
                      ("generator", 3, "recovery from the loss of trainer rank 1 of model gpt2-bpe")]
    assert_same_run(tmp_path / "recovery", demo_reference)


class AlwaysDying(Controller):
    """Replica 0 of llama-char is SIGKILLed each time the run is about to record placements."""

    def record_placement(self):
        _sigkill(self.actors["llama-char"].generators[0])
        super().record_placement()


def test_an_actor_dying_at_every_start_stops_the_run_with_one_line(tmp_path, ray_local, monkeypatch, capsys):
    data = yaml.safe_load(DEMO.read_text())
    data["models"], data["exchange"] = data["models"][:1], {"name": "none"}  # one model: cheaper
    config = tmp_path / "doomed.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))  # sft_tasks order: the model
    monkeypatch.setattr(loop, "Controller", AlwaysDying)
    sets = [arg for s in overrides(tmp_path, "doomed", ["run.max_restarts=2"]) for arg in ("--set", s)]
    t0 = time.monotonic()
    assert main(["run", str(config), *sets]) == 1
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err
    assert last.startswith("error: generation replica 0 of model llama-char died during start-up (")
    assert "after 2 restarts within 600 s (run.max_restarts = 2, run.restart_window_s = 600); stopping" in last
    assert last.endswith("the run has no checkpoint to go on from yet: --resume would start it again at step 1")
    print(f"a replica dying at every start: stopped after {elapsed:.1f} s with\n{last}")



def test_an_out_of_memory_error_is_told_apart_by_the_actor_ray_reports_dead(ray_local):
    """Ray's memory monitor kills a worker to free memory and raises ``OutOfMemoryError``, which
    names no actor: the run's actor that Ray's GCS reports dead is the one that died."""
    from types import SimpleNamespace

    from ray.exceptions import OutOfMemoryError

    from orchestrator.cluster.model_actors import ModelActors
    from orchestrator.controller.faults import identify

    @ray.remote(num_cpus=0)
    class Stub:
        def ping(self) -> bool:
            return True

    alive, dead = Stub.remote(), Stub.remote()
    ray.get([alive.ping.remote(), dead.ping.remote()])
    _sigkill(dead)
    ctrl = SimpleNamespace(names=["m"], actors={"m": ModelActors("m", [alive], [alive, dead], None)},
                           verifier=SimpleNamespace(actors=[alive]))
    fault = identify(ctrl, OutOfMemoryError("1 worker(s) were killed due to the node running low on memory"))
    assert (fault.kind, fault.model, fault.index) == ("trainer", "m", 1)
    ray.kill(alive)
