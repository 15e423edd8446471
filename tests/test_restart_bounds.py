"""The restart bookkeeping of ``orchestrator.controller.faults``, without actors: the back-off
before an actor's next restart, the restarts per actor and their MLflow metric names."""

from __future__ import annotations

import time
from types import SimpleNamespace

from orchestrator.config import load_config
from orchestrator.controller.faults import Fault, backoff_s, restart_metric, restarts
from tests.reference_run import DEMO

REPLICA = Fault("generator", "llama-char", 0, "generation replica 0 of model llama-char")


def _ctrl(deaths: list[tuple[str, float]], backoff: float = 1.0, window: float = 600.0) -> SimpleNamespace:
    config = load_config(DEMO, [f"run.restart_backoff_s={backoff}", f"run.restart_window_s={window}"])
    return SimpleNamespace(config=config, state=SimpleNamespace(
        faults=[{"actor": actor, "time": t, "action": "started it again"} for actor, t in deaths]))


def test_the_back_off_doubles_with_each_restart_of_the_same_actor_within_the_window():
    now = time.time()
    role = REPLICA.role
    # record() has written this death already: the first death of the actor waits nothing
    assert backoff_s(_ctrl([(role, now)]), REPLICA) == 0.0
    assert backoff_s(_ctrl([(role, now - 5), (role, now)]), REPLICA) == 1.0
    assert backoff_s(_ctrl([(role, now - 9), (role, now - 5), (role, now)]), REPLICA) == 2.0
    assert backoff_s(_ctrl([(role, now - 9), (role, now - 5), (role, now)], backoff=0.5), REPLICA) == 1.0
    # other actors' deaths and deaths outside the window do not count; the wait is capped
    assert backoff_s(_ctrl([("verifier actor 0", now - 1), (role, now - 700), (role, now)]), REPLICA) == 0.0
    assert backoff_s(_ctrl([(role, now - i) for i in range(12)]), REPLICA) == 60.0


def test_restarts_are_counted_per_actor_and_named_per_actor_in_mlflow():
    faults = [{"actor": "trainer rank 1 of model b", "action": "restarted"},
              {"actor": "verifier actor 0", "action": "recreated it"},
              {"actor": "trainer rank 1 of model b", "action": "restarted"},
              {"actor": "trainer rank 1 of model b", "action": "stopped the run"}]
    assert restarts(faults) == {"trainer rank 1 of model b": 2, "verifier actor 0": 1}
    assert restart_metric(Fault("trainer", "b", 1, "trainer rank 1 of model b")) == "faults/restarts/b/trainer_1"
    assert restart_metric(REPLICA) == "faults/restarts/llama-char/replica_0"
    assert restart_metric(Fault("verifier", None, 0, "verifier actor 0")) == "faults/restarts/verifier_0"
