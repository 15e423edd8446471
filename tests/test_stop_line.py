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


def test_an_actor_whose_init_raises_is_stopped_with_the_error_it_raised(tmp_path, ray_local):
    """An exception in an actor's ``__init__`` (a vLLM engine refusing its settings, a module a node
    lacks) reaches the driver as Ray's ``ActorDiedError``, whose first line is only "error raised in
    its creation task" (issue #51's thirty-seventh read): the stop line and the restart warning name
    the exception itself, which the job's output (actors do not log to the driver) has nowhere else."""
    import time

    import pytest
    import ray

    from orchestrator.controller.faults import Fault, check_budget
    from orchestrator.controller.stop_line import ActorLost

    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self) -> None:
            import no_such_backend_module  # noqa: F401

        def ping(self) -> bool:
            return True

    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(Replica.remote().ping.remote())
    raised = "ModuleNotFoundError: No module named 'no_such_backend_module'"
    role = "generation replica 0 of model llama-char"
    ctrl = _ctrl(tmp_path, True, 0)
    ctrl.config.run.restart_window_s, ctrl.config.run.max_restarts = 600.0, 1
    ctrl.state = SimpleNamespace(faults=[{"actor": role, "time": time.time()}])
    with pytest.raises(ActorLost) as stopped:
        check_budget(ctrl, Fault("generator", "llama-char", 0, role), "start-up", died.value)
    assert "error raised in its creation task" in str(stopped.value)
    assert raised in str(stopped.value)


def test_an_init_error_over_several_lines_is_named_whole(tmp_path, ray_local):
    """vLLM's engine settings are pydantic dataclasses: a refused value (``gpu_memory_utilization``
    past 1, ``max_model_len`` past the model's) raises a ``ValidationError`` whose message runs over
    lines and ends "For further information visit ...". The stop line took the traceback's last line
    only, so it named no error and no field (issue #51's thirty-eighth read); it names the exception
    whole: its type, the field and the reason."""
    import time

    import pytest
    import ray

    from orchestrator.controller.faults import Fault, check_budget
    from orchestrator.controller.stop_line import ActorLost

    @ray.remote(num_cpus=0)
    class Replica:
        def __init__(self) -> None:
            import pydantic

            class CacheConfig(pydantic.BaseModel):
                gpu_memory_utilization: float = pydantic.Field(gt=0, le=1)

            CacheConfig(gpu_memory_utilization=1.5)

        def ping(self) -> bool:
            return True

    with pytest.raises(ray.exceptions.RayActorError) as died:
        ray.get(Replica.remote().ping.remote())
    role = "generation replica 0 of model qwen2.5-3b"
    ctrl = _ctrl(tmp_path, True, 0)
    ctrl.config.run.restart_window_s, ctrl.config.run.max_restarts = 600.0, 1
    ctrl.state = SimpleNamespace(faults=[{"actor": role, "time": time.time()}])
    with pytest.raises(ActorLost) as stopped:
        check_budget(ctrl, Fault("generator", "qwen2.5-3b", 0, role), "start-up", died.value)
    line = str(stopped.value)
    assert "ValidationError: 1 validation error for CacheConfig" in line
    assert "gpu_memory_utilization" in line and "less than or equal to 1" in line
