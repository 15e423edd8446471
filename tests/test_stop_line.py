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
