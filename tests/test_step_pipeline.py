"""``Controller.step`` as a pipeline of named phases, and per-token arrays kept off the driver
(issue #54): each phase sets the run's stage and times itself by name (a scoring pass inside
routing or training counts as score); each data-parallel rank scores its share of the rows; the
trainers' per-token log-probs (pi_old of own rows,
the receivers' log-probs of routed rows) stay in the object store as refs that the driver hands
on unopened to ``train``, with the values the trainers computed. On the demo pair, real actors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.controller import step_phases as phases
from orchestrator.controller.exchange import concat_shares
from orchestrator.controller.loop import Controller
from orchestrator.controller.phase_clock import PhaseClock
from orchestrator.controller.step_phases import PHASES, StepState
from workers.training.token_refs import TokenRef, resolve
from workers.training.trainer import TorchTrainer

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"
MOST_COMPATIBLE = ["exchange.name=null", "exchange.routing={name: pool, donor: most_compatible}",
                   "exchange.transfer=graft"]


class Staged:
    def __init__(self) -> None:
        self.stage = "start-up"


def test_a_phase_inside_another_counts_as_itself_and_actor_time_moves_to_its_phase():
    """route runs 10 s with a 4 s scoring pass inside: route 6, score 4; train's 7 s with 3 s
    of scoring inside the trainers: train 4, score 7; an untimed phase sets the stage only, and a
    phase left by an exception leaves the stage where it was raised and times nothing."""
    ticks = iter([0.0, 2.0, 6.0, 10.0, 10.0, 17.0, 17.0, 18.0, 20.0, 21.0, 22.0, 30.0])
    ctx = Staged()
    clock = PhaseClock(ctx, ("route", "score", "train"), now=lambda: next(ticks))
    with clock.phase("route"):
        with clock.phase("score"):
            assert ctx.stage == "score"
        assert ctx.stage == "route"
    with clock.phase("train"):
        clock.count_as("score", 3.0)
    with clock.phase("store"):
        assert ctx.stage == "store"
    assert clock.timings == {"route": 6.0, "score": 7.0, "train": 4.0}
    with pytest.raises(RuntimeError), clock.phase("train"):
        with clock.phase("score"):
            raise RuntimeError("a trainer died")
    assert ctx.stage == "score" and clock.timings == {"route": 6.0, "score": 7.0, "train": 4.0}
    # a phase on the same clock after the exception is not nested in the phases it left (22 -> 30)
    with clock.phase("route"):
        pass
    assert clock.timings == {"route": 14.0, "score": 7.0, "train": 4.0} and ctx.stage == "route"


class Recording(Controller):
    """The controller, with every stage it passes through kept in order."""

    @property
    def stage(self) -> str:
        return self._stage

    @stage.setter
    def stage(self, value: str) -> None:
        self._stage = value
        self.__dict__.setdefault("stages", []).append(value)


@pytest.mark.slow
def test_a_step_keeps_per_token_log_probs_off_the_driver(tmp_path, ray_local):
    """One step of the demo pair with a ``most_compatible`` pool (pi_old recomputed: 4
    minibatches; gpt2-bpe on two data-parallel ranks, each scoring half the rows): after routing, the driver's records hold one ``TokenRef`` per row where the
    trainers scored per-token log-probs, and plain floats for the means it routes with; the refs
    resolve to what the same trainers return as arrays; the step then trains and stores, its
    stages in the pipeline's order and its timings the timed phases'; ``Controller.step`` runs
    step 2 through the same phases."""
    cfg = load_config(DEMO, ["run.eval_every=0", "data.eval=[]", "run.steps=2", "algorithm.prompt_batch=8",
                             "models.1.trainer.workers=2",
                             f"run.output_dir={tmp_path}", "run.name=refs", *MOST_COMPATIBLE])
    ctl = Recording(cfg)
    try:
        ctl.start()
        assert ctl.old_logp == "recompute"
        ctl.stages = []
        s = StepState(1, PhaseClock(ctl, PHASES))
        for phase in (phases.generate, phases.verify, phases.advantages, phases.score, phases.route):
            phase(ctl, s)
        assert all(isinstance(cell, TokenRef) for cell in s.record["old_logp"])
        assert all(type(m) is float for m in s.record["mean_logp"])
        routed = [r for r, cell in enumerate(s.train["receiver_logp"]) if cell is not None]
        assert routed and all(isinstance(s.train["receiver_logp"][r], TokenRef) for r in routed)

        assert [len(ctl.actors[name].trainers) for name in ctl.names] == [1, 2]
        for name in ctl.names:  # each rank scores its share of the rows: 64 own rows are 64, or 32 + 32
            own = s.record.select(s.record.where(model=name))
            answers = ctl.actors[name].on_trainers(TorchTrainer.score, own).get()
            ranks = len(ctl.actors[name].trainers)
            assert [len(answer["old_logp"]) for answer in answers] == [len(own) // ranks] * ranks
            want = concat_shares(answers)["old_logp"]
            got = resolve(own, "old_logp")["old_logp"]
            assert all(g.dtype == np.float32 and np.array_equal(g, w) for g, w in zip(got, want, strict=True))
            peers = s.train.select([r for r in routed if s.train["receiver"][r] == name])
            want = concat_shares(ctl.actors[name].on_trainers(TorchTrainer.score_peers, peers).get())["logp"]
            got = resolve(peers, "receiver_logp")["receiver_logp"]
            assert all(g.shape == w.shape and np.allclose(g, w, rtol=0, atol=1e-5) for g, w in zip(got, want, strict=True))

        for phase in (phases.train, phases.collect_ahead, phases.sync, phases.store):
            phase(ctl, s)
        assert ctl.store.path_for(1).is_file() and set(s.metrics) == set(ctl.names)
        assert list(s.clock.timings) == list(PHASES) and all(t >= 0 for t in s.clock.timings.values())
        pipeline = ["generate", "verify", "advantages", "score", "route", "score", "route", "train", "sync", "store"]
        assert ctl.stages == pipeline
        ctl.stages = []
        assert set(ctl.step(2)) == set(ctl.names)  # Controller.step runs the same phases
        assert ctl.stages == pipeline and list(ctl.state.history[-1]["timings"]) == list(PHASES)
    finally:
        ctl.close("FINISHED")
