"""Checkpoints and resume: a crash costs at most the steps since the last checkpoint.

A checkpoint ``checkpoints/step_NNNNNN/`` holds everything a resumed run needs to continue
exactly as an uninterrupted one would (on CPU with a fixed seed, bit for bit):

* per model and trainer rank ``<model>/trainer_rank{r}.pt``: weights, optimiser state,
  policy version, the trainer's NumPy and torch RNG states (``TorchTrainer.save``);
* per model ``<model>/generation_rng.pt``: each generation replica's torch RNG state (the
  replicas get their weights from the trainer at resume);
* ``driver_rng.pt``: the driver's Python, NumPy and torch RNG states;
* ``pending_rollout.pt`` (``run.async: one_step``): the next step's batch, sampled ahead;
* ``controller.json``: the step, the prompt sampler's cursor, the exchange policy's state,
  the exchange totals, the metric and eval history, the trajectory store's position (the
  step: step files past it are dropped at resume) and the MLflow run ids (a resumed job logs
  into the same runs).

It is written into ``.tmp-step_NNNNNN/``, flushed to disk, then renamed: a folder named
``step_*`` is always complete. The last ``run.keep_checkpoints`` are kept; a disk without room
for the saves to come stops the run at the save that finds it
(``orchestrator.controller.disk_room``). The trainer ranks' files are written by the ranks
where they share the run folder with the driver, else sent to the driver, which writes them
(``orchestrator.controller.node_layout``): the folder is the same either way, and a load sends
them back.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import yaml

from graftpool.redaction import MASK
from orchestrator.cluster.actor_calls import get_all
from orchestrator.config import Config, ConfigError, redact
from orchestrator.config.algorithm_section import move_exchange_keys
from orchestrator.controller.disk_room import check_room, saves_to_come
from orchestrator.controller.evaluate import EVALS, drop_evals_after
from orchestrator.controller.node_layout import load_trainers, save_trainers
from orchestrator.controller.trajectory_store import PARTIAL_FILES
from workers.verify.plugin_verifier import absolute_verifier

if TYPE_CHECKING:
    from orchestrator.controller.run_state import RunContext
    from orchestrator.controller.run_storage import RunStorage

STATE_FILE = "controller.json"
PENDING_FILE = "pending_rollout.pt"
# fields a resumed run may change; any other difference from the run folder's config.yaml
# (models, data, algorithm, exchange, seed, ...) would make the resumed run another run
RESUMABLE_CHANGES = ("run.steps", "run.eval_every", "run.checkpoint_every", "run.keep_checkpoints",
                     "run.resume", "run.max_step_retries", "run.max_restarts",
                     "run.restart_window_s", "run.restart_backoff_s", "run.step_snapshot", "run.output_dir", "run.storage", "tracking.", "ray.")
MEMORY_CHANGES = ("trainer.max_tokens_per_micro_batch", "trainer.gradient_checkpointing",
                  "generation.vllm.gpu_memory_utilization", "generation.kv_cache_budget_gb")
"""Fields of ``models.<i>`` a resumed run may change too: what a step holds in a trainer's or replica's
memory, lowered after a GPU out-of-memory error stopped the job (docs/operations.md). The update's
gradient and the sampling distribution do not depend on them (up to float rounding: micro-batches
sum to the minibatch's gradient), but a lower token budget also leaves a peer response past it
untrained (``gate/over_budget``), so a change is said in a warning."""


def _memory_field(key: str) -> bool:
    parts = key.split(".", 2)
    return len(parts) == 3 and parts[0] == "models" and parts[1].isdigit() and parts[2] in MEMORY_CHANGES


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The run's complete checkpoints, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if p.is_dir() and (p / STATE_FILE).is_file()] \
        if root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def read_state(folder: Path) -> dict:
    return json.loads((Path(folder) / STATE_FILE).read_text())


def _flat(prefix: str, value, out: dict) -> dict:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
        for i, v in enumerate(value):
            _flat(f"{prefix}.{i}", v, out)
    else:
        out[prefix] = value
    return out


def prepare_run_dir(run_dir: Path, config: Config, storage: RunStorage | None = None) -> Path | None:
    """Before any actor starts: the checkpoint to resume from (``run.resume`` and one exists),
    else None. Refuses a resume whose config differs from the run folder's in a field that
    matters, with a checkpoint or without one (a run of ``run.checkpoint_every: 0``, finished or
    stopped: the resume would start it again in its folder, so another config would replace that
    run's files), and a fresh run in a folder that holds another run's checkpoints. A resume with
    no checkpoint starts again at step 1: the earlier run's store and evaluation files go, from
    the folder and from ``storage`` (``run.storage``) alike, its ``faults.jsonl`` too (storage's at the
    first upload of the records, ``RunStorage.mirror_records``), as a resume from a checkpoint drops
    the files past it there (:func:`restore_checkpoint`)."""
    latest = latest_checkpoint(run_dir)
    if config.run.resume:
        saved = run_dir / "config.yaml"
        if saved.is_file():
            with warnings.catch_warnings():  # a run folder written before the exchange keys moved
                warnings.simplefilter("ignore", DeprecationWarning)
                raw = move_exchange_keys(yaml.safe_load(saved.read_text()))
                try:  # a field added since the folder was written takes its default
                    raw = redact(Config.model_validate(raw, context={"check_backends": False}).model_dump(mode="json"))
                except ValueError:
                    pass
                old = _flat("", raw, {})
            new = _flat("", redact(config.model_dump(mode="json")), {})
            for side in (old, new):  # a plugin file as the actors get it (a folder written before kept it so)
                if isinstance(side.get("data.verifier"), str):
                    side["data.verifier"] = absolute_verifier(side["data.verifier"])
            # a value the folder holds masked (a secret; a models[].pad_token before redaction knew
            # a tokenizer's special token from a credential) cannot be compared: it is not a change
            differ = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and old.get(k) != MASK
                            and not k.startswith(RESUMABLE_CHANGES))
            changed = [k for k in differ if not _memory_field(k)]
            if changed:
                fresh = ("; set those fields back to resume it, or choose another run.name for a new run"
                         if latest is not None else
                         "; it has no checkpoint, so a run of this config without --resume starts anew in its folder, "
                         "replacing that run's files (or choose another run.name)")
                raise ConfigError(f"--resume: the config differs from {saved} in {', '.join(changed)}; "
                                  "a resumed run needs the same models, data, algorithm, exchange and seed (a "
                                  f"model's {', '.join(MEMORY_CHANGES)} may change){fresh}")
            if differ:
                warnings.warn("--resume: memory settings changed since the checkpoint: " + ", ".join(
                    f"{k} {old.get(k)} -> {new.get(k)}" for k in differ) + " (a lower token budget also leaves "
                    "longer peer responses untrained, gate/over_budget)", stacklevel=2)
        if latest is None:
            _drop_earlier_run(run_dir)  # it starts again at step 1, under new MLflow runs
            # or the earlier run's later steps would stay there beside this one's, one store of two runs
            dropped = 0 if storage is None else storage.drop_steps_after(-1)  # step 0's evaluation too
            if dropped:
                warnings.warn(f"run.storage: a new run starts in {run_dir.name}; dropped {dropped} trajectory and "
                              "evaluation files of an earlier one there", stacklevel=2)
        elif read_state(latest)["step"] > config.run.steps:
            raise ConfigError(f"--resume: run.steps is {config.run.steps} but the latest checkpoint "
                              f"({latest}) is at step {read_state(latest)['step']}")
        else:
            keep_on_resume(run_dir, config)
        return latest
    if latest is not None:
        raise ConfigError(f"{run_dir} holds checkpoints of an earlier run (latest {latest.name}): "
                          "pass --resume (run.resume=true) to continue it, or choose another run.name")
    _drop_earlier_run(run_dir)
    return None


def keep_on_resume(run_dir: Path, config: Config) -> None:
    """A resumed run folder as a save leaves it, before the resume's first save: the complete
    checkpoints but the last ``run.keep_checkpoints`` deleted, and a save that died half-way
    (``.tmp-step_*``); then room on the disk for the saves still to come checked from the latest
    (``orchestrator.controller.disk_room``). A save deletes the older ones only once the new one
    is written whole, so a resume with ``run.keep_checkpoints`` lowered (what the disk-room error
    advises) still held the old number at its first save: keep + 1 of them at that peak, the disk
    as short as before, and the job died writing that save's files (ENOSPC), the steps since the
    resume lost; a resume with nothing changed got there too, the check coming only after a save."""
    run = config.run
    prune_checkpoints(run_dir, run.keep_checkpoints)
    kept = complete_checkpoints(run_dir)
    check_room(kept[-1], len(kept), saves_to_come(read_state(kept[-1])["step"], run.steps, run.checkpoint_every),
               run.keep_checkpoints)


def _drop_earlier_run(run_dir: Path) -> None:
    """A new run in a used folder (or one started again at step 1): the store's and the evaluations'
    step files of the earlier one go, and its ``faults.jsonl``, which the tracker appends to: the
    report read from it would count the earlier job's deaths ("stopped the run" among them) as this
    run's, which its ``summary.json`` and its new MLflow runs' tags leave out."""
    (run_dir / "faults.jsonl").unlink(missing_ok=True)
    stale = sorted({p for folder in ("trajectories", EVALS) for pattern in ("step_*.parquet*", *PARTIAL_FILES)
                    for p in (run_dir / folder).glob(pattern)})  # a killed store writer's file too
    if stale:
        warnings.warn(f"{run_dir}: a new run starts here; dropping {len(stale)} trajectory and evaluation "
                      "files of an earlier one", stacklevel=3)
        for path in stale:
            path.unlink()


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())
    for path in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def driver_rng() -> dict:
    """The driver's Python, NumPy and torch RNG states (what :func:`restore_state` sets back)."""
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def save_checkpoint(ctrl: RunContext, step: int) -> Path:
    """Write checkpoint ``step`` atomically and keep the last ``run.keep_checkpoints``: the
    trainers' files, the run's :class:`~orchestrator.controller.run_state.RunState` and the RNG states."""
    root = ctrl.run_dir / "checkpoints"
    tmp = root / f".tmp-step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    save_trainers(ctrl, tmp)  # on the ranks' nodes, or through the driver (orchestrator.controller.node_layout)
    for name in ctrl.names:
        torch.save(list(ctrl.state.gen_rng[name]), tmp / name / "generation_rng.pt")
    torch.save(driver_rng(), tmp / "driver_rng.pt")
    if ctrl.state.pending is not None:
        torch.save(ctrl.state.pending, tmp / PENDING_FILE)
    tracker = ctrl.tracker
    state = {"step": step, **ctrl.state.to_json(), "store_steps": ctrl.store.steps(),
             "tracking": {"experiment_id": tracker.experiment_id, "parent_run_id": tracker.parent_id,
                          "child_run_ids": dict(tracker.child_ids)}}
    (tmp / STATE_FILE).write_text(json.dumps(state))
    _fsync_tree(tmp)
    final = root / f"step_{step:06d}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    prune_checkpoints(ctrl.run_dir, ctrl.config.run.keep_checkpoints)
    return final


def prune_checkpoints(run_dir: Path, keep: int) -> None:
    """The complete checkpoints but the last ``keep`` deleted, and any save that died half-way
    (``.tmp-step_*``): after a save, and at a resume (:func:`keep_on_resume`)."""
    for old in complete_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old)
    for stale in (run_dir / "checkpoints").glob(".tmp-step_*"):
        shutil.rmtree(stale, ignore_errors=True)


def check_room_after(ctrl: RunContext, folder: Path, step: int) -> None:
    """Room on the run folder's disk for the saves still to come after ``folder``
    (``orchestrator.controller.disk_room``); called once the checkpoint is also in ``run.storage``,
    so that the one the error names is where a resubmitted job resumes from."""
    run = ctrl.config.run
    check_room(folder, len(complete_checkpoints(ctrl.run_dir)), saves_to_come(step, run.steps, run.checkpoint_every),
               run.keep_checkpoints)


def restore_checkpoint(ctrl: RunContext, folder: Path) -> int:
    """Load checkpoint ``folder`` into the running actors and the run's state; returns its step
    (:func:`restore_state`)."""
    state = read_state(folder)
    gen_rng = {name: torch.load(folder / name / "generation_rng.pt", weights_only=False) for name in ctrl.names}
    pending = folder / PENDING_FILE
    return restore_state(ctrl, state, gen_rng, torch.load(folder / "driver_rng.pt", weights_only=False),
                         torch.load(pending, weights_only=False) if pending.is_file() else None,
                         lambda name: load_trainers(ctrl, name, folder), str(folder))


def restore_state(ctrl: RunContext, state: dict, gen_rng: dict[str, list], driver: dict, pending,
                  load_trainer: Callable[[str], int], where: str) -> int:
    """Put the run back at a saved step (a checkpoint, or a step snapshot kept in memory:
    ``orchestrator.controller.snapshot``): every model's ranks load their files
    (``load_trainer(name)``), its replicas get the weights and their RNG states, then the driver's RNG
    states and the run's state (``state``: :meth:`RunState.to_json` with the step). The trajectory
    store forgets the steps after it; the local metric log and flow matrix are cut back to it
    (``metrics.jsonl`` by its start-line convention). Returns the step."""
    step = int(state["step"])
    for name in ctrl.names:
        actors = ctrl.actors[name]
        load_trainer(name)
        get_all(actors.sync_weights())
        states = gen_rng[name]
        if len(states) != len(actors.generators):
            raise ConfigError(f"{where}: model {name} was checkpointed with {len(states)} generation "
                              f"replicas, the config has {len(actors.generators)}")
        get_all(actors.set_rng_states(states))
        ctrl.state.gen_rng[name] = list(states)
    random.setstate(driver["python"])
    np.random.set_state(driver["numpy"])
    torch.set_rng_state(driver["torch"])
    ctrl.state.load_json(state)
    ctrl.state.pending = pending
    ctrl.store.drop_after(step)  # the store, the evaluations and run.storage forget the later steps
    drop_evals_after(ctrl.run_dir, step)
    if ctrl.storage is not None:
        ctrl.storage.drop_steps_after(step)
    tracker = ctrl.tracker
    if not tracker.flows and tracker.flow_path.is_file():
        tracker.flows = {int(f["step"]): f for f in json.loads(tracker.flow_path.read_text())["steps"]}
    tracker.flows = {s: f for s, f in tracker.flows.items() if s <= step}
    return step
