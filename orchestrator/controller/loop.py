"""The controller: the GRAFT step loop over N models (docs/algorithm.md section 2).

Per step (``Controller.step``, one function a phase in ``orchestrator.controller.step_phases``):
generate every model's rollouts (concurrently) -> verify (rewards) -> advantages -> score (old
log-probs, the source side of the gate) -> route (exchange policy, routes) -> train (each
receiver re-tokenises, scores, gates and updates, concurrently) -> sync weights -> store +
metrics. One record carries the step's responses through all of it (``graftpool.step_record``):
generation creates it, each phase adds columns, the routes select the train record, the
trainers return outcome columns, and the store and the metrics read it.
"""

from __future__ import annotations

import json
import os
import random
import time
import warnings
from pathlib import Path

import numpy as np
import ray
import torch
from tqdm import tqdm

from dashboards.background import BackgroundTracker
from dashboards.tracking import Tracker
from dashboards.views import log_views
from graftpool.redaction import install, register_secrets_in
from graftpool.step_record import StepRecord
from graftpool.tasks import Problem
from graftpool.whole_file import write_whole
from orchestrator.cluster.model_actors import ModelActors, spawn_model_actors
from orchestrator.cluster.placement import VERIFIER_CPUS, init_ray
from orchestrator.config import Config, ConfigError, dump_config
from orchestrator.controller import step_phases as phases
from orchestrator.controller.checkpoint import (
    check_room_after,
    prepare_run_dir,
    read_state,
    restore_checkpoint,
    save_checkpoint,
)
from orchestrator.controller.evaluate import evaluate
from orchestrator.controller.faults import (
    TrainerLost,
    recover_trainer,
    rollout_snapshot,
    until_settled,
    with_retries,
)
from orchestrator.controller.node_layout import check_layout, export_trainers
from orchestrator.controller.overlap import collect, launch
from orchestrator.controller.phase_clock import PhaseClock
from orchestrator.controller.prompt_lengths import check_prompt_lengths
from orchestrator.controller.prompts import PromptSampler, load_data, verifier_query
from orchestrator.controller.run_state import RunState, deaths_on_record
from orchestrator.controller.run_storage import RunStorage, open_storage
from orchestrator.controller.snapshot import keep_state, keeps
from orchestrator.controller.step_phases import PHASES, StepState
from orchestrator.controller.summary import write_summary
from orchestrator.controller.trajectory_store import TrajectoryStore
from orchestrator.models import check_models, resolve_model_path
from policies.stored import StoredPeers
from workers.rollout.generation import SamplingParams
from workers.training.sampling_logprobs import old_logp_source
from workers.verify.plugin_verifier import absolute_verifier
from workers.verify.verifier_pool import VerifierPool

# What the controller is doing (``Controller.stage``): the step's phases, and the rest of a run.
# A death is recorded with the stage it was noticed in (``orchestrator.controller.faults``).
STAGES = ("start-up", "generate", "verify", "advantages", "score", "route", "train", "sync", "store", "evaluation",
          "checkpoint", "upload", "snapshot", "recovery", "export", "end")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Controller:
    def __init__(self, config: Config):
        self.config = config
        self.names = [m.name for m in config.models]
        self.run_dir = Path(config.run.output_dir) / config.run.name
        self.policy = config.exchange.policy()
        self.algo = config.algorithm
        self.overlapped = config.run.overlap == "one_step"  # run.async (orchestrator.controller.overlap)
        # where own responses' pi_old comes from (workers.training.sampling_logprobs)
        self.old_logp = old_logp_source(self.algo.old_logprobs, self.algo.minibatches, self.algo.epochs,
                                        self.overlapped)
        self.state: RunState  # the run's progress, made by start() (orchestrator.controller.run_state)
        self.stage = "start-up"  # one of STAGES: what the run is doing now
        self.storage: RunStorage | None = None  # run.storage, opened by start()
        self.shared: dict[str, bool] = {}  # per model: its ranks see the run folder (controller.node_layout)

    # -- set-up ---------------------------------------------------------------------

    def start(self, train: bool = True) -> int:
        """Data, models, actors, verifier, tracking, store (``train=False``: evaluation only); returns the
        step to go on from (``run.resume``'s checkpoint, else 0); bad config, data, models fail before any actor."""
        cfg = self.config
        self.stage = "start-up"
        seed_everything(cfg.run.seed)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.storage = open_storage(cfg.run.storage, self.run_dir, cfg.run.resume) if train else None
        self.trains = train  # False: an evaluation-only start (graftpool eval), whose stop line says so
        resume_from = prepare_run_dir(self.run_dir, cfg, self.storage) if train else None
        if self.storage is not None and resume_from is not None and self.storage.catch_up(
                resume_from, read_state(resume_from)["step"], cfg.run.keep_checkpoints):
            print(f"{cfg.run.name}: uploaded {resume_from.name}, which run.storage lacked whole", flush=True)
        try:
            self.train_set, self.eval_sets = load_data(cfg.data.train, cfg.data.eval, cfg.run.seed)
            self.task_of = {p.prompt_id: p.task for p in self.train_set}
            self.problem_of = {p.prompt_id: p for p in self.train_set}
        except (OSError, ValueError) as exc:
            raise ConfigError(str(exc)) from None
        self.state = RunState.fresh(self.names, PromptSampler(self.train_set, cfg.run.seed), self.policy)
        # an evaluation reads no store: a run folder copied back from a cluster is evaluated without it
        self.stored: list[StoredPeers] = self.policy.stored_donors() if train else []
        for peers in self.stored:  # a store none of whose groups could donate: refused
            try:
                peers.check_usable(self.problem_of, cfg.algorithm.n)
            except ValueError as exc:
                raise ConfigError(str(exc)) from None
        paths = {m.name: resolve_model_path(m) for m in cfg.models}
        tokenizers = check_models(cfg.models, paths)  # the actors load them too: a bad one fails here first
        check_prompt_lengths(cfg.models, tokenizers, {**({"data.train": self.train_set} if train else {}),
                                                      **{f"data.eval {n!r}": p for n, p in self.eval_sets.items()}})
        if train:
            # whole or not at all: a job stopped mid-write left an empty config.yaml that every --resume refused
            write_whole(self.run_dir / "config.yaml", dump_config(cfg))
            self.mirror(self.run_dir / "config.yaml")
        self.started_ray = init_ray(cfg, with_trainer=train)
        # every model's actors, the verifiers and the tracker start side by side; ranks are joined in _settle
        # filled model by model: a later model's placement failing, ``shutdown`` removes the earlier ones' groups
        self.actors: dict[str, ModelActors] = {}
        for i, m in enumerate(cfg.models):
            self.actors[m.name] = spawn_model_actors(
                m, paths[m.name], self.algo, cfg.exchange, cfg.run.seed + 7919 * i, self.policy.trainer_params(),
                with_trainer=train, overlapped=self.overlapped, placement_wait_s=cfg.ray.wait_for_resources_s)
        self.verifier = self.verifier_pool()
        uri = cfg.tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or \
            f"sqlite:///{(Path(cfg.run.output_dir) / 'mlflow.db').resolve()}"
        resume = None if resume_from is None else \
            {**read_state(resume_from)["tracking"], "step": read_state(resume_from)["step"]}
        tracker = Tracker(uri, cfg.tracking.experiment, cfg.run.name if train else f"{cfg.run.name}-eval",
                          cfg.model_dump(mode="json"), self.names, self.run_dir, resume=resume)
        self.tracker = BackgroundTracker(tracker) if cfg.tracking.background else tracker
        if resume_from is not None:  # the killed job's deaths after its checkpoint too (load_json keeps them);
            self.state.faults = deaths_on_record(tracker.fault_path)  # read once the tracker cut a last line short
        if train:
            self.tracker.log_artifact(self.run_dir / "config.yaml")
        self.store = TrajectoryStore(self.run_dir / "trajectories")
        first = read_state(resume_from)["step"] if resume_from is not None else 0
        step = until_settled(self, first, "start-up", lambda: self._settle(train, resume_from))
        if resume_from is not None:
            print(f"{cfg.run.name}: resumed from {resume_from}", flush=True)
        return step

    def _settle(self, train: bool, resume_from: Path | None) -> int:
        """The started actors ready: trainer ranks joined, placement recorded, the replicas' RNG
        states read; then the checkpoint resumed from loaded, or step 0's written. Redone from
        its start when an actor dies meanwhile (``orchestrator.controller.faults.until_settled``)."""
        for actors in self.actors.values():
            actors.join()
        if train:
            self.record_placement()
            check_layout(self)  # what each rank sees of the run folder and run.storage, before step 0
        self.state.gen_rng = {name: self.actors[name].rng_states() for name in self.names}
        if resume_from is not None:
            return restore_checkpoint(self, resume_from)
        if train:  # what a trainer lost before step 1 goes back to: a checkpoint or a snapshot
            keep_state(self, 0)
        return 0

    def verifier_pool(self) -> VerifierPool:
        """The verifier actors (``data.verifier*``, ``fast_path``, ``max_response_chars``), not waited for;
        a plugin file's path made absolute here, in the driver's working directory."""
        data = self.config.data
        return VerifierPool(data.verifier_actors, verifier=absolute_verifier(data.verifier),
                            num_cpus_per_actor=VERIFIER_CPUS, fast_path=data.fast_path,
                            **self.config.verifier_params)

    def shutdown(self) -> None:
        for actors in getattr(self, "actors", {}).values():
            actors.shutdown()
        if getattr(self, "started_ray", False):
            ray.shutdown()

    # -- rollouts -------------------------------------------------------------------

    def _sampling(self, name: str) -> SamplingParams:
        gen = self.config.models[self.names.index(name)].generation
        return SamplingParams(self.algo.n, gen.temperature, gen.top_p, gen.max_new_tokens)

    def _rollout(self, problems: list[Problem], params: dict[str, SamplingParams],
                 stages: tuple[str, str] = ("generate", "verify")) -> tuple[StepRecord, float, float]:
        """Generate for every model concurrently, then verify every response in one pool call
        (``stages``: what :attr:`stage` says meanwhile). Returns the record (model by model,
        prompt by prompt, sample by sample; with ``reward`` and ``reason``) and the two times."""
        self.stage = stages[0]
        t0 = time.perf_counter()
        record = collect(self, launch(self, problems, params))
        t1 = time.perf_counter()
        self.stage = stages[1]
        return self._verify(problems, record), t1 - t0, time.perf_counter() - t1

    def _verify(self, problems: list[Problem], record: StepRecord) -> StepRecord:
        """``reward`` and ``reason`` of every row, in one verifier pool call."""
        problem = {p.prompt_id: p for p in problems}
        verdicts = self.verifier.verify_batch([verifier_query(problem[prompt_id], text) for prompt_id, text
                                               in zip(record["prompt_id"], record["response"], strict=True)])
        return record.with_columns(reward=[float(v.reward) for v in verdicts], reason=[v.reason for v in verdicts])

    # -- one step -------------------------------------------------------------------

    def step(self, step: int) -> dict[str, dict[str, float]]:
        """One step: its phases in order (``orchestrator.controller.step_phases``); returns each model's metrics."""
        s = StepState(step, PhaseClock(self, PHASES))
        for phase in (phases.generate, phases.verify, phases.advantages, phases.score, phases.route, phases.train,
                      phases.collect_ahead, phases.sync, phases.store):
            phase(self, s)
        return s.metrics

    def record_placement(self) -> None:
        """``actors.json`` in the run folder: the Ray node of every model's replicas and trainer
        ranks (rewritten when a fault restarts some)."""
        nodes = {name: self.actors[name].nodes() for name in self.names}
        (self.run_dir / "actors.json").write_text(json.dumps(nodes, indent=2))

    # -- evaluation -----------------------------------------------------------------

    def evaluate(self, step: int, responses: Path | None = None) -> dict[str, dict[str, float]]:
        """pass@1 over ``eval.samples`` samples per prompt, per set and model (controller.evaluate)."""
        return evaluate(self, step, responses)

    # -- the run --------------------------------------------------------------------

    def run(self) -> dict:
        status = "FAILED"
        try:
            step = self.start() + 1
            failures: dict[int, int] = {}
            while True:
                try:
                    self._train(step)
                    break
                except TrainerLost as lost:  # back to the last checkpoint, in this process
                    step = recover_trainer(self, lost, failures) + 1
            self.stage = "end"
            summary = write_summary(self, PHASES)
            status = "FINISHED"
            return summary
        finally:
            self.close(status)

    def close(self, status: str) -> None:
        """End the MLflow runs with ``status`` and stop the actors (and Ray, if we started it). The
        run's records go to ``run.storage`` as they end: a finished run's steps and final evaluation
        after its last checkpoint (all of them without checkpoints) are in no checkpoint's upload, nor
        are a stopped run's deaths since (the one that stopped it among them), which a resume on a new
        head takes from there as one on the same head keeps them. A stopped run's upload that fails
        is a warning: the error that stopped the run is the one raised."""
        try:
            if hasattr(self, "tracker"):
                self.tracker.finish(status)
                if status == "FINISHED":
                    self._mirror_records()
                else:
                    try:
                        self._mirror_records()
                    except Exception as exc:  # noqa: BLE001 - the stop's own error is raised
                        warnings.warn(f"run.storage: the stopped run's records were not uploaded "
                                      f"({type(exc).__name__}: {exc})", stacklevel=2)
        finally:
            self.shutdown()

    def _mirror_records(self) -> None:
        """The tracker's metric log, deaths, flow matrices and ``mlflow.json``, as they stand, to ``run.storage``."""
        if self.storage is not None:
            self.tracker.drain()  # a background tracker's queued calls written to the records first
            self.storage.mirror_records()

    def _train(self, first: int) -> None:
        """Steps ``first`` .. ``run.steps`` (with evaluations and checkpoints), then the final
        evaluation, views and export. Dead generation/verifier actors are recreated and the
        step retried (``orchestrator.controller.faults``); a dead trainer raises TrainerLost."""
        cfg = self.config.run
        bar = tqdm(range(first, cfg.steps + 1), desc=f"{cfg.name}", unit="step", dynamic_ncols=True,
                   initial=first - 1, total=cfg.steps)
        if cfg.eval_at_start and first == 1 and self.eval_sets and not self.state.eval_history:
            self._evaluate_with_retries(0)
        for step in bar:
            per_model = with_retries(self, step, f"step {step}", lambda s=step: self.step(s), rollout_snapshot(self))
            bar.set_postfix({n[:10]: f"r={m['train/reward_mean']:.2f} x={m['exchange/received']:.0f}"
                             for n, m in per_model.items()})
            if cfg.eval_every and (step % cfg.eval_every == 0) and self.eval_sets:
                self._evaluate_with_retries(step)
                if self.config.tracking.views:
                    log_views(self.tracker, self.state.history, self.state.eval_history, self.store.folder, step, cfg.eval_every)
            if keeps(cfg, step):  # a checkpoint or a step snapshot (orchestrator.controller.snapshot)
                with_retries(self, step, keeps(cfg, step), lambda s=step: keep_state(self, s))
        if self.eval_sets and (not self.state.eval_history or self.state.eval_history[-1]["step"] != cfg.steps):
            self._evaluate_with_retries(cfg.steps)
        if self.config.tracking.views:
            log_views(self.tracker, self.state.history, self.state.eval_history, self.store.folder, cfg.steps,
                      cfg.eval_every or cfg.steps)
        with_retries(self, cfg.steps, "export", self._export)

    def _evaluate_with_retries(self, step: int) -> dict[str, dict[str, float]]:
        restore = rollout_snapshot(self)
        return with_retries(self, step, f"evaluation at step {step}", lambda: self.evaluate(step), restore)

    def checkpoint(self, step: int) -> Path:
        """Save every model's trainer ranks, generation RNG states and the controller's state
        atomically under ``checkpoints/step_NNNNNN/`` (``orchestrator.controller.checkpoint``)."""
        self.stage = "checkpoint"
        folder = save_checkpoint(self, step)
        self.state.snapshot = None  # as new as it, and on disk
        if self.storage is not None:
            self.stage = "upload"
            self._mirror_records()  # the run's records up to this step
            self.storage.save_checkpoint(folder, step, self.config.run.keep_checkpoints)
        check_room_after(self, folder, step)  # after the upload: the checkpoint it names is in run.storage too
        return folder

    def mirror(self, path: Path) -> None:
        """Copy a file or folder of the run folder to ``run.storage`` (``orchestrator.controller.run_storage``)."""
        if self.storage is not None:
            self.storage.mirror(path)

    def _export(self) -> None:
        self.stage = "export"
        final = self.run_dir / "final"
        export_trainers(self, final)  # on the ranks' nodes, or through the driver
        self.mirror(final)


def train(config: Config) -> dict:
    register_secrets_in(config.model_dump(mode="json"))  # masked in all output (graftpool.redaction)
    install()
    return Controller(config).run()
