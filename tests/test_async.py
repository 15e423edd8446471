"""``run.async: one_step`` (orchestrator/controller/overlap.py): the next step's batch is sampled
while this step trains, one update stale, and the ratio's pi_old is the sampling weights' own
log-probs. On the real trainer, the demo pair's reference settings (``tests/reference_run.py``)
and real process deaths: a run stopped after a checkpoint and resumed ends equal to the
uninterrupted one_step run, and a chaos run with a kill in each phase of a step (a replica
sampling ahead while the trainers train, the verifier, a trainer rank, a replica during the
weight sync and during an evaluation) ends equal to it too."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from graftpool.contracts import OWN
from orchestrator.config import load_config
from orchestrator.controller.exchange import with_source_side
from orchestrator.controller.loop import Controller
from tests.chaos import Kill, chaos_run, tables
from tests.reference_run import DEMO, PAIR, STEPS, assert_same_run, overrides
from tests.tiny_pair import batch_of, build_groups
from workers.receiver.retokenize import token_rows
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.training.sampling_logprobs import old_logp_source
from workers.training.trainer import TorchTrainer

ONE_STEP = [*PAIR, "run.async=one_step"]


def test_one_step_ratio_uses_the_sampling_weights_log_probs(paths):
    """The receiver's responses were sampled by its weights one update ago (theta_0); it trains
    from theta_1. Its first update's loss is Eq. 2 with rho = pi_theta1 / pi_theta0 (the behaviour
    log-probs the replica recorded, what ``with_source_side`` puts in ``old_logp`` under one_step),
    not rho = 1: an update whose pi_old were the current weights' gives another loss."""
    from graftpool.tasks import generate_problems

    path = paths["gpt2-bpe"]
    problems = generate_problems(["add", "sub"], 6, seed=21, split="train")
    torch.manual_seed(0)
    completions = HFGeneration(path).generate([p.prompt for p in problems], SamplingParams(n=4, max_new_tokens=24))
    rewards = np.array([[1.0, 0.0, 1.0, 0.0]] * len(problems))  # mixed groups: every row has a gradient
    groups = build_groups("gpt2-bpe", problems, completions, rewards, [[""] * 4] * len(problems))
    trainer = TorchTrainer(path, lr=3e-3, minibatches=1, overlapped=True, seed=0)
    assert trainer.takes_old_logp  # one optimizer step, yet pi_old is not sg(pi_theta) under one_step
    assert old_logp_source("auto", 4, 1, overlapped=True) == "sampling"  # what the controller asks for
    warm = batch_of(groups[:2])  # one update first: theta_0 -> theta_1
    trainer.train(warm.with_columns(old_logp=[np.asarray(lp, dtype=np.float32) for lp in warm["gen_logprobs"]]))

    batch = batch_of(groups)
    record = with_source_side(batch, {}, "sampling")
    assert all(np.array_equal(o, np.asarray(g, dtype=np.float32)) for o, g in zip(record["old_logp"],
                                                                                     batch["gen_logprobs"], strict=True))
    rows = token_rows([trainer._prompt_ids(p) for p in batch["prompt"]], batch["token_ids"])
    current = [lp.double() for lp in trainer.score_rows(rows)]  # theta_1, before the update
    behaviour = [torch.tensor(lp, dtype=torch.float64) for lp in batch["gen_logprobs"]]
    advantages = torch.tensor(batch["advantage"], dtype=torch.float64)

    def eq2(old: list[torch.Tensor]) -> float:
        terms = []
        for new, o, a in zip(current, old, advantages, strict=True):
            rho = torch.exp(new - o)
            terms.append(torch.minimum(rho * a, torch.clamp(rho, 0.8, 1.28) * a).sum())
        return float(-torch.stack(terms).sum() / sum(len(c) for c in current))

    expected, stale_free = eq2(behaviour), eq2(current)
    assert abs(expected - stale_free) > 1e-3, "theta_1 differs enough from theta_0 for the check to bite"
    loss = trainer.train(record).minibatches[0].loss
    assert loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
    assert loss != pytest.approx(stale_free, rel=1e-4, abs=1e-6)
    assert all(k == OWN for k in batch["kind"])


def test_one_step_refuses_what_would_break_it_and_bounds_staleness():
    """pi_old from the trainers' pass, or a sync that keeps no copy of the sampling weights, can't
    serve one_step: both fail at load naming the field; rows staler than the bound stop the run."""
    from orchestrator.config import ConfigError
    from orchestrator.controller.overlap import check_staleness

    with pytest.raises(ConfigError, match=r"algorithm.old_logprobs: recompute takes pi_old from the trainer's"):
        load_config(DEMO, ["run.async=one_step", "algorithm.old_logprobs=recompute"])
    with pytest.raises(ConfigError, match=r"models.1.generation.weight_sync: run.async: one_step needs object_store"):
        load_config(DEMO, ["run.async=one_step", "models.1.generation.weight_sync=collective"])
    with pytest.raises(ValueError, match="recompute"):
        old_logp_source("recompute", 4, 1, overlapped=True)
    check_staleness({"a": 1, "b": 0}, bound=1)
    with pytest.raises(RuntimeError, match=r"more than 1 update\(s\) before training on them: \{'b': 2\}"):
        check_staleness({"a": 1, "b": 2}, bound=1)


@pytest.fixture(scope="module")
def one_step_reference(tmp_path_factory, ray_local):
    """The demo pair's reference settings with run.async: one_step, uninterrupted."""
    out = tmp_path_factory.mktemp("async")
    Controller(load_config(DEMO, overrides(out, "ref", ONE_STEP))).run()
    return out / "ref"


class Stopped(Exception):
    pass


class StopsAfterCheckpoint(Controller):
    """Stops the run (an exception out of ``run``) once checkpoint ``at`` is written."""

    at = 2

    def checkpoint(self, step):
        folder = super().checkpoint(step)
        if step == self.at:
            raise Stopped(f"stopped after checkpoint {step}")
        return folder


@pytest.mark.slow
def test_one_step_run_samples_ahead_and_resumes_equal(one_step_reference, tmp_path):
    """The uninterrupted run: step 1 sampled on the starting weights, every later step's rows one
    update stale (``train/staleness``, and the store's ``policy_version`` one behind the
    trainer's); its checkpoints hold the batch sampled ahead. A run stopped after checkpoint 2
    and resumed from it ends equal to the uninterrupted one (store, evaluations, metrics, weights)."""
    ref = one_step_reference
    staleness = [json.loads(line)["metrics"]["train/staleness"] for line in (ref / "metrics.jsonl").read_text()
                 .splitlines() if '"train/staleness"' in line]
    assert staleness == [0.0, 0.0] + [1.0] * (2 * (STEPS - 1))
    assert (ref / "checkpoints" / "step_000003" / "pending_rollout.pt").is_file()
    assert not (ref / "checkpoints" / f"step_{STEPS:06d}" / "pending_rollout.pt").exists()  # the last: none ahead
    with pytest.raises(Stopped):
        StopsAfterCheckpoint(load_config(DEMO, overrides(tmp_path, "stopped", ONE_STEP))).run()
    Controller(load_config(DEMO, overrides(tmp_path, "stopped", [*ONE_STEP, "run.resume=true"]))).run()
    assert_same_run(tmp_path / "stopped", ref)


PLAN = [
    Kill("train", "generator", 0.02),  # sampling the next batch while the trainers train
    Kill("verify", "verifier", 0.0, 0.5),
    Kill("train", "trainer", 0.05, 0.99),  # back to the last checkpoint, with its batch sampled ahead
    Kill("sync", "generator"),
    Kill("evaluation", "generator", 0.05),
]


@pytest.mark.slow
def test_one_step_run_with_a_kill_in_each_phase_ends_as_the_reference(one_step_reference, tmp_path):
    result = chaos_run(tmp_path, "chaos-async", 0, PLAN, one_step_reference, ["run.async=one_step"])
    print("\n" + tables([result]))
    assert not result.error, result.error
    assert [k.victim for k in result.killed] == [k.victim for k in PLAN], result.skipped
    assert result.same and not result.unexplained, result.unexplained
    faults = json.loads((tmp_path / "chaos-async" / "summary.json").read_text())["faults"]
    assert any(f["phase"].startswith("generation of step") for f in faults), \
        "a replica that died sampling ahead is recovered by sampling that batch again"


TWO_REPLICAS = ["models.0.generation.replicas=2", "models.1.generation.replicas=2"]


@pytest.mark.slow
def test_one_step_with_two_replicas_a_replica_killed_while_sampling_ahead_ends_as_its_reference(ray_local,
                                                                                                tmp_path):
    """Chaos under overlap with ``replicas: 2`` per model (issue #54): a replica is SIGKILLed while
    it samples the next batch beside the trainers' update, then one in the weight sync; the run
    ends equal to the uninterrupted run with the same replicas (store, evaluations, metrics,
    weights). With two replicas the batch's prompts are split between them, so the batch sampled
    ahead is in two parts, and the dead replica's part is sampled again from its RNG state."""
    Controller(load_config(DEMO, overrides(tmp_path, "ref", [*ONE_STEP, *TWO_REPLICAS]))).run()
    plan = [Kill("train", "generator", 0.02, 0.0), Kill("sync", "generator", 0.0, 0.99)]
    result = chaos_run(tmp_path, "chaos-two", 0, plan, tmp_path / "ref", ["run.async=one_step", *TWO_REPLICAS])
    print("\n" + tables([result]))
    assert not result.error, result.error
    assert [k.victim for k in result.killed] == [k.victim for k in plan], result.skipped
    assert result.same and not result.unexplained, result.unexplained
    faults = json.loads((tmp_path / "chaos-two" / "summary.json").read_text())["faults"]
    assert any(f["phase"].startswith("generation of step") for f in faults), faults
