"""What a run has done so far, in one record, and what the code that saves, restores and
recovers it may touch of the controller.

:class:`RunState` is everything a checkpoint saves besides the actors' own files (weights,
optimiser states, trainer RNG states): the prompt sampler's cursor, the exchange policy's
state, the exchange totals, the metric and evaluation history, the deaths survived and each
generation replica's last known RNG state, and with ``run.async: one_step`` the next step's
batch, sampled while this step trained (:class:`PendingRollout`). A resume, a trainer's recovery
and a retried step restore it (``orchestrator.controller.checkpoint``, ``orchestrator.controller.faults``).

:class:`RunContext` is the part of the controller those modules use, as a protocol: they
depend on it, not on ``orchestrator.controller.loop``, so the import arrows point one way.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from graftpool.step_record import StepRecord
from orchestrator.cluster.actor_calls import get_all

if TYPE_CHECKING:
    import ray

    from dashboards.background import BackgroundTracker
    from dashboards.tracking import Tracker
    from orchestrator.cluster.model_actors import ModelActors
    from orchestrator.config import Config
    from orchestrator.controller.prompts import PromptSampler
    from orchestrator.controller.run_storage import RunStorage
    from orchestrator.controller.trajectory_store import TrajectoryStore
    from policies.interface import ExchangePolicy
    from workers.verify.verifier_pool import VerifierPool

EXCHANGE_COUNTS = ("all_fail", "received", "given", "prompts")


@dataclass
class PendingRollout:
    """The next step's batch, generated ahead (``run.async: one_step``): its prompt ids, in the
    order sampled, and its rows of the step record (not yet verified)."""

    prompt_ids: list[str]
    record: StepRecord


@dataclass
class Snapshot:
    """One step's state kept in memory, so that a trainer's death costs at most one step
    (``orchestrator.controller.snapshot``, which takes and restores it)."""

    step: int
    trainers: dict[str, list[ray.ObjectRef]]  # per model: each rank's files (snapshot_files)
    state: dict  # RunState.to_json(), with the step
    gen_rng: dict[str, list]
    driver: dict
    pending: PendingRollout | None


@dataclass
class RunState:
    """The run's progress that is not inside an actor (see the module docstring)."""

    sampler: PromptSampler
    policy: ExchangePolicy
    totals: dict[str, dict[str, int]]  # per model: EXCHANGE_COUNTS summed over the steps
    history: list[dict] = field(default_factory=list)  # per step: timings and per-model metrics
    eval_history: list[dict] = field(default_factory=list)  # per evaluation: step and scores
    faults: list[dict] = field(default_factory=list)  # actor deaths survived (orchestrator.controller.faults)
    recovering: list[dict] = field(default_factory=list)  # those of them not yet recovered from (not saved)
    gen_rng: dict[str, list] = field(default_factory=dict)  # per model: each replica's torch RNG state
    pending: PendingRollout | None = None  # run.async one_step: the next step's batch, sampled ahead (saved apart)
    snapshot: Snapshot | None = None  # the last step's state, kept in memory (orchestrator.controller.snapshot; not saved)

    @classmethod
    def fresh(cls, names: list[str], sampler: PromptSampler, policy: ExchangePolicy) -> RunState:
        return cls(sampler, policy, {name: dict.fromkeys(EXCHANGE_COUNTS, 0) for name in names})

    def to_json(self) -> dict:
        """The JSON-able part (``controller.json``; the RNG states are saved as torch files)."""
        return {"sampler": self.sampler.state_dict(), "policy": self.policy.state_dict(), "totals": self.totals,
                "history": self.history, "eval_history": self.eval_history, "faults": self.faults}

    def load_json(self, state: dict) -> None:
        """Back to a saved :meth:`to_json`. A death recorded since (in this process) stays recorded;
        one the checkpoint holds too (it was written while the run recovered from it) is the same
        death, by its time: this process's entry is the newer one (it may have its ``recovery_s``)."""
        self.sampler.load_state_dict(state["sampler"])
        self.policy.load_state_dict(state["policy"])
        self.totals = state["totals"]
        self.history = state["history"]
        self.eval_history = state["eval_history"]
        known = {f["time"]: f for f in self.faults}
        saved = [known.pop(f["time"], f) for f in state.get("faults", [])]
        self.faults = [*saved, *known.values()]

    def rollout_snapshot(self) -> Callable[[], dict[str, list]]:
        """What a retried step or evaluation starts from again: the replicas' RNG states, the
        prompt cursor and the policy's state. Returns the function that puts them back and
        returns the RNG states (to load into the replicas)."""
        gen_rng = {name: list(states) for name, states in self.gen_rng.items()}
        sampler = self.sampler.state_dict()
        policy = copy.deepcopy(self.policy.state_dict())

        def restore() -> dict[str, list]:
            self.sampler.load_state_dict(sampler)
            self.policy.load_state_dict(copy.deepcopy(policy))
            self.gen_rng = {name: list(states) for name, states in gen_rng.items()}
            return self.gen_rng

        return restore


def deaths_on_record(path: Path) -> list[dict]:
    """The deaths a run folder's ``faults.jsonl`` (``Tracker.log_fault``) says the run survived,
    oldest first, one entry per death (its recovery's line, where written, replacing its own):
    what a resumed job starts ``RunState.faults`` from. Its checkpoint holds only the deaths
    before it was written; those the killed job survived after it are on record here too, as in
    the reports' "Faults" (read from the same lines), so ``summary.json``'s ``faults`` and
    ``restarts`` count them. A death that stopped a run (action ``stopped the run``) is left out."""
    from dashboards.data import read_faults_jsonl

    return [f for f in read_faults_jsonl(path) if f.get("action") != "stopped the run"]


class RunContext(Protocol):
    """The controller as checkpointing and fault recovery see it (``orchestrator.controller.loop.Controller``)."""

    config: Config
    run_dir: Path
    names: list[str]
    actors: dict[str, ModelActors]
    verifier: VerifierPool
    state: RunState
    stage: str  # what the run is doing now (orchestrator.controller.loop.STAGES): faults record it
    trains: bool  # False: an evaluation-only start (graftpool eval)
    store: TrajectoryStore
    storage: RunStorage | None
    tracker: Tracker | BackgroundTracker
    shared: dict[str, bool]  # per model: its trainer ranks see the run folder (orchestrator.controller.node_layout)

    def record_placement(self) -> None: ...

    def checkpoint(self, step: int) -> Path: ...

    def mirror(self, path: Path) -> None: ...


def load_replica_rng(ctx: RunContext, gen_rng: dict[str, list]) -> None:
    """Every generation replica's torch RNG state set to ``gen_rng``."""
    get_all([ref for name in ctx.names for ref in ctx.actors[name].set_rng_states(gen_rng[name])])
