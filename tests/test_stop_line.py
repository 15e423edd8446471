"""What the run's one-line stop tells the user to do next (``orchestrator/controller/stop_line.py``):
``graftpool eval`` takes no ``--resume`` and has no checkpoint to go on from (issue #51's
twenty-second read: its line said to pass ``--resume``); a run without a checkpoint yet starts
again on ``--resume``, its step files dropped where ``run.checkpoint_every`` is 0."""

from __future__ import annotations

from types import SimpleNamespace

from orchestrator.controller.stop_line import EVAL_HINT, NO_CHECKPOINT_HINT, next_step_hint, stop


def _ctrl(run_dir, trains: bool, checkpoint_every: int) -> SimpleNamespace:
    return SimpleNamespace(trains=trains, run_dir=run_dir,
                           config=SimpleNamespace(run=SimpleNamespace(checkpoint_every=checkpoint_every)))


def test_an_evaluation_only_start_is_told_to_run_the_evaluation_again(tmp_path):
    line = str(stop("generation replica 0 of model llama-char died during start-up", next_step_hint(_ctrl(tmp_path, False, 0))))
    assert line.endswith(EVAL_HINT) and "--resume" not in line


def test_a_run_without_a_checkpoint_is_told_a_resume_starts_it_again(tmp_path):
    assert next_step_hint(_ctrl(tmp_path, True, 5)) == NO_CHECKPOINT_HINT
    assert next_step_hint(_ctrl(tmp_path, True, 0)) == (
        NO_CHECKPOINT_HINT + ", its step files dropped (run.checkpoint_every keeps checkpoints)")


def _stop_line_of_a_failed_start(tmp_path, replica_class) -> str:
    """The stop line of a run whose replica (``replica_class``, a real Ray actor whose ``__init__``
    raises) died at start-up past the restart bound: ``check_budget`` given Ray's real error."""
    import time

    import pytest
    import ray

    from orchestrator.controller.faults import Fault, check_budget
    from orchestrator.controller.stop_line import ActorLost

    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(replica_class.remote().ping.remote())
    role = "generation replica 0 of model llama-char"
    ctrl = _ctrl(tmp_path, True, 0)
    ctrl.config.run.restart_window_s, ctrl.config.run.max_restarts = 600.0, 1
    ctrl.state = SimpleNamespace(faults=[{"actor": role, "time": time.time()}])
    with pytest.raises(ActorLost) as stopped:
        check_budget(ctrl, Fault("generator", "llama-char", 0, role), "start-up", died.value)
    return str(stopped.value)


def test_an_actor_whose_init_raises_is_stopped_with_the_error_it_raised(tmp_path, ray_local):
    """An exception in an actor's ``__init__`` (a vLLM engine refusing its settings, a module a node
    lacks) reaches the driver as Ray's ``ActorDiedError``, whose first line is only "error raised in
    its creation task" (issue #51's thirty-seventh read): the stop line and the restart warning name
    the exception itself, which the job's output (actors do not log to the driver) has nowhere else."""
    import ray

    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self) -> None:
            import no_such_backend_module  # noqa: F401

        def ping(self) -> bool:
            return True

    line = _stop_line_of_a_failed_start(tmp_path, Replica)
    assert "error raised in its creation task" in line
    assert "ModuleNotFoundError: No module named 'no_such_backend_module'" in line


def test_an_actor_init_error_of_several_lines_is_named_by_its_first(tmp_path, ray_local):
    """vLLM refuses its settings with pydantic's ``ValidationError`` (``CacheConfig(gpu_memory_utilization=1.5)``),
    whose message runs over several lines and ends "For further information visit https://errors.pydantic.dev/...":
    the traceback's last line alone named that address, not the error (issue #51's thirty-eighth read, half b).
    The stop line names the exception's own line and the field it refused."""
    import ray

    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self) -> None:
            from pydantic import BaseModel, Field

            class CacheConfig(BaseModel):
                gpu_memory_utilization: float = Field(le=1.0)

            CacheConfig(gpu_memory_utilization=1.5)

        def ping(self) -> bool:
            return True

    line = _stop_line_of_a_failed_start(tmp_path, Replica)
    assert "ValidationError: 1 validation error for CacheConfig" in line
    assert "gpu_memory_utilization" in line


def test_an_actor_killed_by_the_system_is_stopped_with_rays_reason(tmp_path, ray_local):
    """A system death (the actor's process killed, as by the kernel's OOM killer or Ray's memory
    monitor, or its node lost) reaches the driver as Ray's ``ActorDiedError``, whose first line, "The
    actor died unexpectedly before finishing this task.", names no cause; the reason is in its last
    lines (issue #51's fortieth read, half a). The stop line names it: on an autoscaling cluster a lost
    node's logs go with the node."""
    import ray

    @ray.remote(num_cpus=0)
    class Replica:
        def ping(self) -> bool:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
            return True

    line = _stop_line_of_a_failed_start(tmp_path, Replica)
    assert "The actor died unexpectedly before finishing this task." in line
    assert "The actor is dead because its worker process has died." in line
    assert "actor_id:" not in line  # Ray's context fields stay out
