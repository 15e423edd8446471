"""The phases of one GRAFT step (``Controller.step``, docs/design.md "One step"), one function
each, in the order the step runs them:

generate -> verify -> advantages -> score -> route -> train -> (collect the batch sampled
ahead) -> sync -> store

Each reads and adds to the step's :class:`StepState` and runs under its phase's name on the
step's :class:`PhaseClock` (the run's stage, and the phase's time in ``timings``; a scoring
pass inside route or train counts as ``score``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from graftpool.contracts import ExchangeInput, Route
from graftpool.step_record import StepRecord
from graftpool.tasks import Problem
from orchestrator.cluster.actor_calls import get_all, get_each
from orchestrator.controller.exchange import (
    compatibility_matrix,
    exchange_input,
    flow_matrix,
    train_record,
    with_advantages,
    with_answer_starts,
    with_outcomes,
    with_receiver_logp,
    with_source_side,
)
from orchestrator.controller.faults import with_retries
from orchestrator.controller.overlap import Rollout, await_next, check_staleness, collect, launch
from orchestrator.controller.phase_clock import PhaseClock
from orchestrator.controller.records import store_table
from orchestrator.controller.run_state import PendingRollout, RunContext
from orchestrator.controller.step_metrics import model_metrics, pool_metrics
from orchestrator.controller.task_metrics import train_task_metrics
from policies.interface import ExchangePolicy
from policies.stored import StoredPeers, stored_row_name
from workers.rollout.generation import SamplingParams
from workers.training.trainer import TorchTrainer

PHASES = ("generate", "verify", "route", "score", "train", "sync")
"""The timed phases (``timings``, ``time/<phase>``, ``summary.json``'s ``mean_step_time``)."""


class StepContext(RunContext, Protocol):
    """The controller as a step's phases see it (``orchestrator.controller.loop.Controller``)."""

    policy: ExchangePolicy
    old_logp: str  # where own responses' pi_old comes from (workers.training.sampling_logprobs)
    overlapped: bool  # run.async one_step
    stored: list[StoredPeers]
    problem_of: dict[str, Problem]
    task_of: dict[str, str]

    def _sampling(self, name: str) -> SamplingParams: ...

    def _verify(self, problems: list[Problem], record: StepRecord) -> StepRecord: ...


@dataclass
class StepState:
    """What one step's phases hand each other."""

    step: int
    clock: PhaseClock
    start: float = field(default_factory=time.perf_counter)
    problems: list[Problem] = field(default_factory=list)
    record: StepRecord = field(default_factory=StepRecord)  # the rollout record (generation's rows + columns)
    ahead: Rollout | None = None  # run.async one_step: the next step's batch, in flight
    following: StepRecord | None = None  # ... and once collected
    inp: ExchangeInput | None = None
    routes: list[Route] = field(default_factory=list)
    train: StepRecord = field(default_factory=StepRecord)  # the train record
    results: dict = field(default_factory=dict)  # receiver -> TrainResult
    staleness: dict[str, int] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)


def generate(ctx: StepContext, s: StepState) -> None:
    """The step's rollout record: sampled now, or (run.async one_step) during the previous
    step; then, under one_step and unless this is the last step, the next batch launched."""
    with s.clock.phase("generate"):
        params = {name: ctx._sampling(name) for name in ctx.names}
        pending = ctx.state.pending  # run.async one_step: sampled while the previous step trained
        if pending is None:
            s.problems = ctx.state.sampler.next_batch(ctx.config.algorithm.prompt_batch)
            s.record = collect(ctx, launch(ctx, s.problems, params))
        else:
            s.problems, s.record = [ctx.problem_of[i] for i in pending.prompt_ids], pending.record
    if ctx.overlapped and s.step < ctx.config.run.steps:
        s.ahead = launch(ctx, ctx.state.sampler.next_batch(ctx.config.algorithm.prompt_batch), params)


def verify(ctx: StepContext, s: StepState) -> None:
    """``reward`` and ``reason`` of every row (one verifier pool call)."""
    with s.clock.phase("verify"):
        s.record = ctx._verify(s.problems, s.record)


def advantages(ctx: StepContext, s: StepState) -> None:
    """``advantage``: GRPO's, per (model, prompt) group (Eq. 1)."""
    with s.clock.phase("advantages"):
        s.record = with_advantages(s.record, ctx.names, ctx.config.algorithm.n)


def score(ctx: StepContext, s: StepState) -> None:
    """The gate's source side: ``mean_logp`` and, where the trainers take it, ``old_logp``
    (per-token refs of the trainers' pass, left in their object store)."""
    with s.clock.phase("score"):
        s.record = with_source_side(s.record, ctx.actors, ctx.old_logp, ctx.policy.recompute_source)


def route(ctx: StepContext, s: StepState) -> None:
    """The policy's input (live models and stored donors), the compatibility pass where the
    policy needs it (timed as ``score``), the routes, and the train record they select."""
    with s.clock.phase("route"):
        n = ctx.config.algorithm.n
        prompt_ids = [p.prompt_id for p in s.problems]
        stored = {stored_row_name(peers.model): peers for peers in ctx.stored}
        s.inp = exchange_input(s.record, ctx.names, prompt_ids, n,
                               {key: peers.rewards_for(prompt_ids, n) for key, peers in stored.items()})
        scored: dict = {}
        if ctx.policy.needs_compatibility:
            with s.clock.phase("score"):
                s.inp.compatibility, scored = compatibility_matrix(s.record, s.inp, ctx.actors,
                                                                   ctx.policy.donor_groups(s.inp))
        s.routes = ctx.policy.plan(s.inp)
        prompts = [p.prompt for p in s.problems]
        donors = StepRecord.concat([s.record, *(peers.record(prompt_ids, prompts, list(s.record.columns))
                                                for peers in stored.values())])
        s.train = with_answer_starts(train_record(donors, s.routes, s.inp), ctx.actors)
        if scored:
            s.train = with_receiver_logp(s.train, scored)


def train(ctx: StepContext, s: StepState) -> None:
    """Every receiver's update on its rows of the train record, concurrently (the scoring in
    each trainer timed as ``score``); the outcome columns joined; staleness checked."""
    with s.clock.phase("train"):
        objective = ctx.policy.objective(ctx.config.algorithm.n)
        calls = {name: ctx.actors[name].on_trainers(TorchTrainer.train, s.train.select(s.train.where(receiver=name)),
                                                    objective) for name in ctx.names}
        s.results = get_each(calls)  # a donor rank's death, not its receiver's failed fetch, is what is raised
        s.clock.count_as("score", max(r.timings["score"] for r in s.results.values()))
    s.train = with_outcomes(s.train, ctx.names, s.results)
    versions = s.record["policy_version"]  # the weights that sampled each row (trainer versions)
    s.staleness = {name: s.results[name].version - 1 - min(versions[r] for r in s.record.where(model=name))
                   for name in ctx.names}
    check_staleness(s.staleness, 1 if ctx.overlapped else 0)


def collect_ahead(ctx: StepContext, s: StepState) -> None:
    """run.async one_step: the batch sampled ahead, collected before the replicas get this
    step's weights (timed as ``generate``)."""
    if s.ahead is not None:
        with s.clock.phase("generate"):
            s.following = await_next(ctx, s.step, s.ahead)


def sync(ctx: StepContext, s: StepState) -> None:
    """The new weights to every model's generation replicas."""
    with s.clock.phase("sync"):
        with_retries(ctx, s.step, "weight sync",
                     lambda: get_all([ref for name in ctx.names for ref in ctx.actors[name].sync_weights()]))


def store(ctx: StepContext, s: StepState) -> None:
    """The train record to the trajectory store, the step's metrics logged, and the batch
    sampled ahead kept as the next step's."""
    with s.clock.phase("store"):
        ctx.mirror(ctx.store.write_table(s.step, store_table(s.step, s.train, ctx.task_of)))
        s.metrics = log_metrics(ctx, s, time.perf_counter() - s.start)
        ctx.state.pending = None if s.ahead is None else \
            PendingRollout([p.prompt_id for p in s.ahead.problems], s.following)


def log_metrics(ctx: StepContext, s: StepState, wall: float) -> dict[str, dict[str, float]]:
    """Per model: its own rows', its batch's and its trainer's metrics (``step_metrics``) and its
    exchange totals; for the pool: the timings, routes and flows; the step in the run's history."""
    assert s.inp is not None
    timings = s.clock.timings
    flow = flow_matrix(s.routes, len(s.inp.models))
    ctx.tracker.log_flow(s.step, list(s.inp.models), ctx.names, flow)
    per_model: dict[str, dict[str, float]] = {}
    for i, name in enumerate(ctx.names):
        own, batch = s.record.select(s.record.where(model=name)), s.train.select(s.train.where(receiver=name))
        metrics, counts = model_metrics(i, name, own, batch, s.results[name], flow, s.inp.models,
                                        ctx.config.algorithm.n, timings)
        metrics.update(train_task_metrics(own, batch, ctx.task_of))
        metrics["train/staleness"] = float(s.staleness[name])  # updates between sampling and this update
        for key, value in counts.items():
            ctx.state.totals[name][key] += value
        per_model[name] = metrics
        ctx.tracker.log(s.step, metrics, model=name)
    ctx.tracker.log(s.step, {**pool_metrics(flow, s.inp.models, len(ctx.names), timings), "time/wall": wall})
    ctx.state.history.append({"step": s.step, "timings": timings, "wall": wall, "models": per_model})
    return per_model
