"""Restarting what died, not the pool, end to end on CPU with real actors
(``orchestrator.controller.faults``, ``orchestrator.controller.snapshot``):

* a trainer rank and the other model's generation replica SIGKILLed in their ``__init__`` are
  started again, side by side (start-up settles once more, not once per death), and alone: the
  rank's peer (its process group not yet formed) and the other actors keep their Ray actor ids;
* a run without checkpoints (``run.checkpoint_every: 0``) whose trainer rank is SIGKILLed at step
  3 goes back to the snapshot of step 2 kept in the object store and redoes one step.

Both end equal to the uninterrupted reference run (``tests/reference_run.py``): store, evaluation
files, summary, metrics, final weights. Per-actor restart counts are in ``summary.json``."""

from __future__ import annotations

import time

import pytest

from orchestrator.cluster.model_actors import spawn_model_actors
from orchestrator.config import load_config
from orchestrator.controller import loop
from orchestrator.controller.loop import Controller
from tests.reference_run import DEMO, assert_same_run, overrides
from tests.test_startup_faults import _sigkill

pytestmark = pytest.mark.slow


def _ids(ctrl: Controller) -> dict[str, str]:
    return {f"{kind} {i} of {name}": actor._actor_id.hex() for name, actors in ctrl.actors.items()
            for kind, group in (("replica", actors.generators), ("rank", actors.trainers))
            for i, actor in enumerate(group)}


class Watched(Controller):
    """Keeps every actor's id as spawned (``spawned``) and at the end of the run (``final``), and
    how often start-up's settling began (``settles``)."""

    spawned: dict[str, str]
    final: dict[str, str]
    settles = 0

    def _settle(self, train, resume_from):
        if not hasattr(self, "spawned"):
            self.spawned = _ids(self)
        self.settles += 1
        return super()._settle(train, resume_from)

    def _export(self):
        self.final = _ids(self)
        super()._export()


def test_actors_killed_at_start_up_are_started_again_alone_and_together(demo_reference, tmp_path, monkeypatch):
    """A generation replica of llama-char SIGKILLed in its ``__init__`` as soon as its model's
    actors are spawned, and trainer rank 1 of gpt2-bpe in its ``__init__`` as soon as the last
    model's are: both dead before start-up settles anything. Both are started again, side by side
    and alone; the run ends equal to the reference. (One run for what were two tests with the same
    two deaths at start-up, the other in ``tests/test_startup_faults.py``: every check of both.)"""
    killed, spawned = {}, {}

    def spawn_and_kill(cfg, *args, **kwargs):
        spawned[cfg.name] = actors = spawn_model_actors(cfg, *args, **kwargs)
        if cfg.name == "llama-char":
            killed["replica"] = _sigkill(actors.generators[0])
        if cfg.name == "gpt2-bpe":  # the last model: both dead before start-up settles anything
            killed["rank"] = _sigkill(actors.trainers[1])
        return actors

    monkeypatch.setattr(loop, "spawn_model_actors", spawn_and_kill)
    ctrl = Watched(load_config(DEMO, overrides(tmp_path, "one")))
    t0 = time.monotonic()
    summary = ctrl.run()
    print(f"run with a replica and a trainer rank killed in __init__: {time.monotonic() - t0:.1f} s")
    assert killed == {"rank": "PENDING_CREATION", "replica": "PENDING_CREATION"}, "killed in __init__"
    assert [(f["kind"], f["step"], f["phase"], f["actor"]) for f in summary["faults"]] == \
        [("trainer", 0, "start-up", "trainer rank 1 of model gpt2-bpe"),
         ("generator", 0, "start-up", "generation replica 0 of model llama-char")]
    changed = sorted(k for k in ctrl.spawned if ctrl.spawned[k] != ctrl.final[k])
    assert changed == ["rank 1 of gpt2-bpe", "replica 0 of llama-char"], "only the dead actors are started again"
    assert ctrl.settles == 2, "both restarted side by side: start-up settles once more, not once per death"
    assert summary["restarts"] == {"trainer rank 1 of model gpt2-bpe": 1, "generation replica 0 of model llama-char": 1}
    assert_same_run(tmp_path / "one", demo_reference)


class TrainerKilledAtStep3(Controller):
    def step(self, step):
        if step == 3 and not self.state.faults:
            _sigkill(self.actors["gpt2-bpe"].trainers[1])
        return super().step(step)


def test_a_run_without_checkpoints_survives_a_trainer_death_losing_one_step(demo_reference, tmp_path):
    config = load_config(DEMO, overrides(tmp_path, "nockpt", ["models.1.trainer.workers=2",
                                                              "run.checkpoint_every=0"]))
    summary = TrainerKilledAtStep3(config).run()
    assert config.run.step_snapshot == "auto"  # the default: snapshots where no checkpoint is written
    assert not (tmp_path / "nockpt" / "checkpoints").exists() or \
        not list((tmp_path / "nockpt" / "checkpoints").glob("step_*"))
    faults = summary["faults"]
    assert [(f["kind"], f["step"], f["phase"]) for f in faults] == [("trainer", 3, "step 3")]
    assert "went back to the snapshot of step 2" in faults[0]["action"]
    assert faults[0]["recovery_s"] >= 0
    assert_same_run(tmp_path / "nockpt", demo_reference)
