"""Rollouts in flight, and generation that overlaps training (``run.async``).

A :class:`Rollout` is one batch's generation on every model's replicas: started by
:func:`launch` (the calls return at once), waited for by :func:`collect`. A synchronous step
(``run.async: off``) launches and collects its own batch. With ``run.async: one_step`` a step t
launches the generation of step t+1's batch before it verifies, scores, routes and trains its own
(sampled during step t-1), and waits for it after its update and before the weight sync
(:func:`await_next`), so the replicas sample step t+1 with the weights step t started from: one
update stale, at most (``check_staleness``), with pi_old the behaviour log-probs
(``workers.training.sampling_logprobs``). The exchange still happens on one step's groups.

What the overlap keeps exact:

- the batch sampled ahead is part of the run's state (``RunState.pending``, saved in every
  checkpoint), so a resumed run trains the batch an uninterrupted one would;
- a replica that dies while it samples ahead is started again with the weights its peers
  sampled with (the last sync's, ``ModelActors.reload_synced``: the sync of step t's weights
  waits for the batch) and the replicas' RNG states from before the launch, and the batch is
  sampled again (:func:`await_next`);
- a death elsewhere in the step retries the step from its start (``faults.with_retries``): the
  pending batch is the same, the prompt sampler and the RNG states are put back, and the
  batch ahead is launched again.

What it does not: the run's last step samples nothing ahead, so a finished run resumed with a
larger ``run.steps`` samples its next step synchronously, on the newest weights (staleness 0),
where a longer uninterrupted run would have sampled it one update stale. The prompts are the
same; the rollouts are not.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from graftpool.step_record import StepRecord
from graftpool.tasks import Problem
from orchestrator.cluster.actor_calls import Pending
from orchestrator.controller.faults import with_retries
from orchestrator.controller.run_state import load_replica_rng
from workers.rollout.generation import GenerationWorker, SamplingParams

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext


@dataclass
class Rollout:
    """One batch's generation in flight: its problems, the sampling settings per model, the
    replicas' RNG states before it started, and the calls."""

    problems: list[Problem]
    params: dict[str, SamplingParams]
    rng_before: dict[str, list]
    calls: dict[str, Pending]


def launch(ctx: RunContext, problems: list[Problem], params: dict[str, SamplingParams]) -> Rollout:
    """Start generating ``problems`` on every model's replicas (``rollout``, split over them)."""
    ids, prompts = [p.prompt_id for p in problems], [p.prompt for p in problems]
    calls = {name: ctx.actors[name].on_replicas(GenerationWorker.rollout, ids, prompts, params[name]) for name in ctx.names}
    return Rollout(problems, params, copy.deepcopy(ctx.state.gen_rng), calls)


def collect(ctx: RunContext, rollout: Rollout) -> StepRecord:
    """Wait for a rollout: the record, model by model (prompt by prompt, sample by sample); the
    replicas' RNG states after it become the run's."""
    record = StepRecord.concat([rollout.calls[name].get() for name in ctx.names])
    ctx.state.gen_rng = {name: ctx.actors[name].rng_states() for name in ctx.names}
    return record


def await_next(ctx: RunContext, step: int, rollout: Rollout) -> StepRecord:
    """Wait for the batch step ``step`` launched for step ``step + 1``; a replica that died
    meanwhile is started again (with the weights the others sampled with) and the whole batch
    sampled again from the RNG states it started from."""

    def again() -> None:
        ctx.state.gen_rng = copy.deepcopy(rollout.rng_before)
        load_replica_rng(ctx, ctx.state.gen_rng)
        rollout.calls = launch(ctx, rollout.problems, rollout.params).calls

    return with_retries(ctx, step, f"generation of step {step + 1}", lambda: collect(ctx, rollout), again)


def check_staleness(staleness: dict[str, int], bound: int) -> None:
    """Every model's rows were sampled at most ``bound`` updates before the weights that train on
    them (0 in a synchronous run, 1 with ``run.async: one_step``); else the run is wrong."""
    over = {name: s for name, s in staleness.items() if s > bound}
    if over:
        raise RuntimeError(f"rollouts sampled more than {bound} update(s) before training on them: {over}")
