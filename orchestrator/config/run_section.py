"""``run:`` (steps, evaluations, checkpoints, restarts, output), ``eval:``, ``tracking:``
(MLflow) and ``ray:``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from graftpool.sections import Strict
from orchestrator.config.base import SafeName


class EvalConfig(Strict):
    samples: int = Field(8, ge=1)
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_prompts: int | None = Field(None, ge=1)


class RunConfig(Strict):
    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    name: SafeName = "run"
    steps: int = Field(10, ge=1)
    eval_every: int = Field(5, ge=0)
    eval_at_start: bool = False  # also evaluate the starting models, as step 0 (learning curves from 0)
    checkpoint_every: int = Field(0, ge=0)  # save trainer + controller state every K steps
    keep_checkpoints: int = Field(2, ge=1)  # the last K checkpoints are kept
    resume: bool = False  # continue from the latest complete checkpoint in the run folder, if any
    max_step_retries: int = Field(2, ge=0)  # actor deaths survived per step before the run fails
    max_restarts: int = Field(3, ge=0)  # restarts of one actor within restart_window_s; one more stops the run
    restart_window_s: float = Field(600.0, gt=0)
    # wait before restarting an actor that died k > 0 times before within restart_window_s:
    # restart_backoff_s * 2**(k-1) s, at most 60 s (orchestrator.controller.faults.backoff_s)
    restart_backoff_s: float = Field(1.0, ge=0)
    # the last step's trainer state kept in Ray's object store (orchestrator.controller.snapshot), so a
    # trainer's death costs at most one step; auto: only where checkpoint_every is 0
    step_snapshot: Literal["auto", "on", "off"] = "auto"
    seed: int = Field(0, ge=0, lt=2**32)  # numpy's and torch's global seeds take [0, 2**32)
    # run.async (orchestrator.controller.overlap): off, or one_step: the next step's rollouts are sampled
    # while this step trains, on the weights this step started from (one update stale; pi_old is then the
    # behaviour log-probs, workers.training.sampling_logprobs)
    overlap: Literal["off", "one_step"] = Field("off", alias="async")
    output_dir: Path = Path("runs")
    # the run's durable copy (orchestrator.controller.run_storage): a path or a pyarrow filesystem URI
    # (file:///..., s3://bucket/prefix); checkpoints, store, final models go there as written
    storage: str | None = None


class TrackingConfig(Strict):
    uri: str | None = None  # None: sqlite:///<run.output_dir>/mlflow.db, or $MLFLOW_TRACKING_URI
    # MLflow refuses an empty name or one over 500 characters, which made the whole job's store "unreachable"
    experiment: str = Field("graftpool", min_length=1, max_length=500)
    # the step's metrics, flow matrix and plots logged on a thread of the driver while the next step
    # starts (dashboards.background); reads of the tracker wait for them. false: in the step itself
    background: bool = True
    # the plots of dashboards/views.py, rendered and logged at each evaluation and at the end
    # (about 1 CPU s a time); false: none, for runs nobody looks at (the fault tests)
    views: bool = True


class RayConfig(Strict):
    address: str | None = None  # None: a local instance (or the cluster under `ray job submit`)
    num_cpus: int | None = Field(None, ge=1)
    # on a cluster: how long the job waits for the autoscaler to add the nodes its bundles need
    # (orchestrator.cluster.autoscale); 0: fail at once if they are not there
    wait_for_resources_s: float = Field(600.0, ge=0)
