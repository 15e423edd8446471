"""MLflow logging: one parent run per job, one nested child run per model.

Metric names (all MLflow-safe): ``train/...``, ``exchange/...``, ``gate/...``,
``eval/<set>/pass_at_1`` (MLflow names allow no "@"), ``time/<phase>``. The pool-level
flow matrix goes to the parent run as ``exchange/flow/<donor>/<receiver>`` (metrics) and
``exchange/flow_matrix.json`` (artifact, every step). Actor deaths and recoveries
(:meth:`Tracker.log_fault`) go to the parent run as ``faults/...`` metrics and one
``graftpool.fault.<ms>`` tag each, and to ``faults.jsonl``. Every call is flushed at once, so
metrics show up while the job runs.

If the tracking server cannot be reached, training goes on: every metric is also kept in
``metrics.jsonl`` in the run folder, a warning says so, and the tracker tries the server
again every ``retry_after_s`` seconds (default 30, or ``$GRAFTPOOL_TRACKING_RETRY_S``), replaying what it missed when the server is back.
Each outage's two warnings (out of reach; back, replayed) carry its number, so that a second
outage is shown too.
Every warning goes through :func:`graftpool.redaction.redact_text` (an MLflow error quotes
the full URI, password included), and ``mlflow.json`` keeps the URI without its password.
Our HTTP calls use a short timeout and no backoff (``MLFLOW_HTTP_REQUEST_*`` variables
the user did not set are overridden for the duration of our calls only), so that a dead
server costs at most a few seconds once per retry period, never minutes per step.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from dashboards.metric_log import EVENTS, end_at_a_line, values_between
from dashboards.mlflow_basics import (
    FAULT_TAG,
    MAX_TAG_CHARS,
    RESUME_TAG,
    default_artifact_location,
    fault_tags,
    flatten_params,
    quick_http,
    safe_metric_name,
)
from dashboards.sqlite_store import seed_sqlite_store
from graftpool.redaction import redact, redact_text, register_secrets_in, without_password
from graftpool.whole_file import read_json, write_whole

MAX_PENDING = 200_000  # metric values kept for replay while the server is down (all are in metrics.jsonl)


class Tracker:
    """Parent run + one child run per model; every metric also goes to ``metrics.jsonl``."""

    def __init__(self, uri: str, experiment: str, run_name: str, config: dict, models: list[str],
                 local_dir: Path, retry_after_s: float | None = None, http_timeout_s: int = 5,
                 resume: dict | None = None):
        self.uri, self.experiment, self.run_name = uri, experiment, run_name
        register_secrets_in(uri)  # its password is masked wherever an error quotes it
        self.shown_uri = redact_text(uri)  # for messages: no password
        self.models = list(models)
        self.local_dir = Path(local_dir)
        self.local_dir.mkdir(parents=True, exist_ok=True)
        # a secondary run in a job's folder (``<name>-eval`` in ``<name>/``: the eval command)
        # keeps its own files there, so that the job's own local records stay whole
        folder = self.local_dir.name
        suffix = "." + safe_metric_name(run_name[len(folder) + 1:]).replace("/", "_") \
            if run_name.startswith(folder + "-") and len(run_name) > len(folder) + 1 else ""
        self.local_log = self.local_dir / f"metrics{suffix}.jsonl"
        self.pointer_path = self.local_dir / f"mlflow{suffix}.json"
        self.flow_path = self.local_dir / f"flow_matrix{suffix}.json"
        self.fault_path = self.local_dir / f"faults{suffix}.jsonl"
        self.retry_after_s = float(os.environ.get("GRAFTPOOL_TRACKING_RETRY_S", "30")) \
            if retry_after_s is None else retry_after_s
        self.http_timeout_s = http_timeout_s
        self.ok = True
        self.failures = 0
        self.outages = 0  # times the store went out of reach; numbers each outage's two warnings
        self.experiment_id: str | None = None
        self.parent_id: str | None = None
        self.child_ids: dict[str, str] = {}
        self.flows: dict[int, dict] = {}
        self._params: dict[str, str] = {}
        flatten_params("", redact(config), self._params)
        self._params_logged = False
        self._pending: list[tuple[str | None, Metric]] = []
        self._pending_artifacts: dict[tuple, tuple[str | None, Path, str | None]] = {}
        self._pending_tags: dict[str, str] = {}  # the job's run's tags, sent with the next flush
        self._retry_at = 0.0
        self._last_step: int | None = None  # the highest step logged (since going back: mark_resume)
        self._caught_up: int | None = None  # the highest step logged when nothing was left to send
        self._lost_from: int | None = None  # the lowest step of a value dropped unsent (MAX_PENDING, refused)
        self._dropped = 0  # how many values were dropped unsent (they are in metrics.jsonl only)
        earlier = read_json(self.pointer_path)  # the killed job's, for a resume: what its store had been sent
        if resume and not resume.get("parent_run_id") and earlier.get("parent_run_id"):
            # the killed job reached its store only after this checkpoint (it names no runs): its runs go on
            resume = {**resume, **{k: earlier.get(k) for k in ("experiment_id", "parent_run_id", "child_run_ids")}}
        # ``resume`` (a resumed job, from its checkpoint): the runs to log into again, as
        # {"experiment_id", "parent_run_id", "child_run_ids", "step"}; the parameters are there
        self._reopen = bool(resume and resume.get("parent_run_id"))
        self._resumed_step = int(resume.get("step", 0)) if resume else None
        same_runs = self._reopen and earlier.get("parent_run_id") == resume["parent_run_id"]
        if not same_runs:
            self.pointer_path.unlink(missing_ok=True)  # a stale pointer of an earlier run
        if self._reopen:
            self.experiment_id = resume.get("experiment_id")
            self.parent_id = resume["parent_run_id"]
            self.child_ids = {m: i for m, i in (resume.get("child_run_ids") or {}).items() if m in self.models}
            self._params_logged = True
        for record in (self.local_log, self.fault_path):  # a copy cut short (dashboards.metric_log)
            dropped = end_at_a_line(record)
            if dropped:
                self._warn(f"{record}: its last line was cut short; dropped its {dropped} bytes", stacklevel=2)
        if same_runs and "caught_up_step" in earlier:
            # the store has what the earlier job sent; what it logged and had not sent when it ended (its
            # store out of reach, then the job killed) is sent again, from the step it last caught up at
            caught = earlier["caught_up_step"]
            self._pending = self._logged_between(caught, self._resumed_step or 0)
            # kept in the pointer until sent (a job killed before, its store still out of reach: the next
            # resume sends it too), at most the checkpoint's step (the steps past it are logged again)
            self._caught_up = None if caught is None else min(int(caught), self._resumed_step or 0)
            write_whole(self.pointer_path, json.dumps({**earlier, "caught_up_step": self._caught_up}, indent=2))
        elif resume and not self._reopen:  # the earlier job never reached its store: new runs, its values
            self._pending = self._logged_between(None, self._resumed_step or 0)
        if resume:  # its deaths' tags too (the reports read deaths from them): set again, the same values
            self._pending_tags = fault_tags(self.fault_path)
        if self._reopen:  # what the killed job sent past the checkpoint is superseded (the reports drop it)
            self._tag_resume(self._resumed_step or 0)
        start = {"event": "start", "run_name": run_name, "time": time.time()}
        if resume:
            start["resumed_from_step"] = int(resume.get("step", 0))
        with self.local_log.open("a") as f:  # a (re)start: later lines supersede earlier ones
            f.write(json.dumps(start) + "\n")
        self.client: MlflowClient | None = None  # made on the first connection (a bad URI is a warning)
        self._try()

    # -- connection -------------------------------------------------------------------

    def _try(self, then=None, force: bool = False) -> bool:
        """Connect if needed, send what is queued, then call ``then``; False on failure."""
        if not self.ok and not force and time.monotonic() < self._retry_at:
            return False
        try:
            with quick_http(self.http_timeout_s):
                if (self.client is None or self._reopen or self.parent_id is None
                        or len(self.child_ids) < len(self.models)):
                    self._connect()
                self._flush()
                if then is not None:
                    then()
        except Exception as exc:  # noqa: BLE001 - any tracking failure must not stop training
            self._fail(exc)
            return False
        if not self.ok:  # values dropped unsent (``_lost``) were not replayed: the warning says which
            lost = "" if self._lost_from is None else (f", except the values dropped unsent (the first at step "
                                                       f"{self._lost_from}), which are only in {self.local_log}")
            self._warn(f"MLflow tracking at {self.shown_uri} is reachable again (outage {self.outages} of this "
                       f"job is over); the values logged while it was down have been replayed{lost}", stacklevel=3)
        self.ok = True
        return True

    def _connect(self) -> None:
        if self.client is None:
            with contextlib.suppress(OSError):  # no copy (e.g. a read-only cache): MLflow makes it
                seed_sqlite_store(self.uri)
            self.client = MlflowClient(tracking_uri=self.uri)
        if self._reopen:  # a resumed job: its runs (ended, or left RUNNING by a crash) go on
            try:
                for run_id in [self.parent_id, *self.child_ids.values()]:
                    self.client.update_run(run_id, status="RUNNING")
            except MlflowException as exc:  # a server's RestException, a SQL store's MlflowException
                if exc.get_http_status_code() >= 500:  # the store failed, not the lookup
                    raise
                self._warn(f"MLflow has no run {run_id} to resume ({exc}); logging into new runs",
                           stacklevel=2)
                # the experiment too: it was the old store's (a new store has only experiment 0)
                self.experiment_id, self.parent_id, self.child_ids, self._params_logged = None, None, {}, False
                self._caught_up = None  # the new runs have nothing yet
                self._pending = self._logged_between(None, self._resumed_step or 0) + [  # with every death
                    p for p in self._pending if p[1].step > (self._resumed_step or 0) and not p[1].key.startswith(EVENTS)]
            self._reopen = False
            if self.parent_id is not None:
                self._write_pointer()
        if self.experiment_id is None:
            found = self.client.get_experiment_by_name(self.experiment)
            self.experiment_id = found.experiment_id if found else self.client.create_experiment(
                self.experiment, artifact_location=default_artifact_location(self.uri))
        if self.parent_id is None:
            self.parent_id = self.client.create_run(
                self.experiment_id, run_name=self.run_name,
                tags={"graftpool.role": "job", "graftpool.models": ",".join(self.models)}).info.run_id
            self._write_pointer()
        if not self._params_logged:
            items = [Param(k, v) for k, v in sorted(self._params.items())]
            for start in range(0, len(items), 100):
                self.client.log_batch(self.parent_id, params=items[start:start + 100])
            self._params_logged = True
        for model in self.models:
            if model not in self.child_ids:
                child = self.client.create_run(
                    self.experiment_id, run_name=f"{self.run_name}/{model}",
                    tags={"mlflow.parentRunId": self.parent_id, "graftpool.model": model,
                          "graftpool.role": "model"})
                self.child_ids[model] = child.info.run_id
                self._write_pointer()

    def _logged_between(self, first: int | None, last: int) -> list[tuple[str | None, Metric]]:
        """``metrics.jsonl``'s values for steps ``first`` (None: the first) to ``last``, to replay for a
        resumed job (:func:`dashboards.metric_log.values_between`)."""
        now = int(time.time() * 1000)
        return [(model, Metric(key, value, now, step))
                for model, key, step, value in values_between(self.local_log, self.models, first, last)]

    def _warn(self, text: str, stacklevel: int) -> None:
        """A warning with every secret masked (``str(exc)`` of MLflow quotes the full URI).

        Python shows a warning text once per place it is raised from (the ``default`` action of
        a run without ``-W``): an outage's two warnings carry its number (:attr:`outages`), or a
        second outage with the same error would say nothing, neither that the store is out of
        reach again nor that it is back."""
        warnings.warn(redact_text(text), stacklevel=stacklevel + 1)

    def _write_pointer(self) -> None:
        """``mlflow.json`` in the run folder: where this run's MLflow records are. The URI is
        kept without its password (user and host stay): the reader brings the credentials
        (``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``, or ``--tracking-uri``).
        ``caught_up_step``: the highest step logged at a flush that left nothing to send (None: not
        yet); a job resumed in this folder sends ``metrics.jsonl``'s values from it to its checkpoint."""
        uri = without_password(self.uri)
        if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_absolute():
            uri = f"sqlite:///{Path(uri[len('sqlite:///'):]).resolve()}"
        pointer = {"tracking_uri": uri, "experiment": self.experiment,
                   "experiment_id": self.experiment_id, "parent_run_id": self.parent_id,
                   "child_run_ids": self.child_ids, "caught_up_step": self._caught_up}
        # whole or not at all: one cut part way made a resume send nothing the killed job left unsent
        write_whole(self.pointer_path, json.dumps(pointer, indent=2))

    def _fail(self, exc: Exception) -> None:
        self.failures += 1
        self._retry_at = time.monotonic() + self.retry_after_s
        if self.ok:
            self.outages += 1
            host = urlparse(self.shown_uri).netloc or self.shown_uri
            self._warn(f"MLflow tracking at {host} is unreachable (outage {self.outages} of this job; "
                       f"{type(exc).__name__}: {redact_text(str(exc))[:300]}); training goes on, metrics "
                       f"are kept in {self.local_log} (retrying every {self.retry_after_s:g}s)", stacklevel=4)
        self.ok = False

    def _run_id(self, model: str | None) -> str:
        return self.child_ids[model] if model else self.parent_id

    def _flush(self) -> None:
        """Send what is queued, oldest first; on failure the rest stays queued."""
        while self._pending:
            model = self._pending[0][0]
            batch = []
            for m, metric in self._pending:
                if m != model or len(batch) == 500:
                    break
                batch.append(metric)
            try:
                self.client.log_batch(self._run_id(model), metrics=batch)
            except MlflowException as exc:  # a server's RestException, or a SQL store's as its server would answer
                if exc.get_http_status_code() >= 500:
                    raise
                # the store is up but refuses these values (a key over 250 characters): drop them rather than
                # block the queue, which a SQL store (the default sqlite one) did, taken for an outage
                self._lost(min(metric.step for metric in batch), f"MLflow refused {len(batch)} metric values ({exc})",
                           len(batch))
            del self._pending[:len(batch)]
        caught = self._last_step if self._lost_from is None or self._last_step is None \
            else min(self._last_step, self._lost_from - 1)
        if caught is not None and self._caught_up != caught:
            self._caught_up = caught  # every value logged up to it is in the store
            self._write_pointer()
        if self._pending_tags:
            tags = [RunTag(k, v) for k, v in self._pending_tags.items()]
            for start in range(0, len(tags), 100):
                self.client.log_batch(self.parent_id, tags=tags[start:start + 100])
            self._pending_tags = {}
        for key in list(self._pending_artifacts):
            model, path, artifact_path = self._pending_artifacts[key]
            if path.exists():
                self.client.log_artifact(self._run_id(model), str(path), artifact_path)
            del self._pending_artifacts[key]

    def _lost(self, step: int, why: str, count: int, warn: bool = True) -> None:
        """Values from ``step`` on will never be in the store: ``caught_up_step`` stays below it, so that
        the reports read this run from ``metrics.jsonl`` (``dashboards.data.store_behind``) and a
        resume sends them again, rather than the store's runs with a silent gap."""
        self._lost_from = step if self._lost_from is None else min(self._lost_from, step)
        self._dropped += count
        if warn:
            self._warn(f"MLflow tracking at {self.shown_uri}: {why}; the values from step {step} are only in "
                       f"{self.local_log}", stacklevel=3)

    # -- logging ----------------------------------------------------------------------

    def log(self, step: int, metrics: dict[str, float], model: str | None = None) -> None:
        clean = {safe_metric_name(k): float(v) for k, v in metrics.items()
                 if v is not None and math.isfinite(float(v))}
        with self.local_log.open("a") as f:
            f.write(json.dumps({"step": step, "model": model, "metrics": clean}) + "\n")
        now = int(time.time() * 1000)
        self._pending += [(model, Metric(k, v, now, step)) for k, v in clean.items()]
        self._last_step = step if self._last_step is None else max(self._last_step, step)
        if len(self._pending) > MAX_PENDING:
            dropped = self._pending[:len(self._pending) - MAX_PENDING]
            self._lost(min(metric.step for _, metric in dropped), f"more than {MAX_PENDING} metric values "
                       "waited for it; the oldest were dropped", len(dropped), warn=self._lost_from is None)
            del self._pending[:len(dropped)]
        self._try()

    def log_fault(self, step: int, entry: dict, deaths: int | None = None) -> None:
        """An actor's death (``entry`` as in ``RunState.faults``: step, phase, stage, actor,
        kind, action, time), its recovery (the same entry with ``recovery_s``), or a death that
        stopped the run (action "stopped the run", with ``error``): a line of ``faults.jsonl``;
        on the job's run the metrics ``faults/<kind>`` (1) and ``faults/deaths`` (``deaths``, the
        run's count so far) at a death, ``faults/recovery_s`` at a recovery, ``faults/fatal``
        at a stop, all at ``step``; and the tag ``graftpool.fault.<ms of the death>`` holding the
        entry as JSON (a recovery rewrites it)."""
        text = redact_text(json.dumps(entry))
        with self.fault_path.open("a") as f:
            f.write(text + "\n")
        self._pending_tags[f"{FAULT_TAG}{int(entry['time'] * 1000)}"] = text[:MAX_TAG_CHARS]
        if "recovery_s" in entry:
            metrics = {"faults/recovery_s": entry["recovery_s"]}
        else:
            metrics = {f"faults/{entry['kind']}": 1.0}
            if deaths is not None:
                metrics["faults/deaths"] = deaths
            if entry.get("action") == "stopped the run":
                metrics["faults/fatal"] = 1.0
        self.log(step, metrics)

    def mark_resume(self, step: int) -> None:
        """The job went back to its checkpoint at ``step`` (in-process recovery): what
        ``metrics.jsonl`` holds past it is superseded by what comes next, so the store has caught up
        to ``step`` at most (``caught_up_step``): a resume after a kill sends the steps logged again
        from there, not only those past the step the store had before the recovery."""
        with self.local_log.open("a") as f:
            f.write(json.dumps({"event": "start", "run_name": self.run_name, "time": time.time(),
                                "resumed_from_step": int(step)}) + "\n")
        self._tag_resume(step)
        if self._last_step is not None:
            self._last_step = min(self._last_step, int(step))
        if self._lost_from is not None and self._lost_from > step:
            self._lost_from, self._dropped = None, 0  # the steps it was lost at are logged again
        if self._caught_up is not None and self._caught_up > step:
            self._caught_up = int(step)
            if self.parent_id is not None and self.pointer_path.is_file():
                self._write_pointer()

    def _tag_resume(self, step: int) -> None:
        """The job's run's ``graftpool.resume.<ms>`` tag (sent with the next flush): at that time the
        job went back to ``step``, so every value logged before it for a later step is superseded.
        MLflow cannot delete them; the reports leave them out (``dashboards.data.superseded``)."""
        self._pending_tags[f"{RESUME_TAG}{int(time.time() * 1000)}"] = str(int(step))

    def log_artifact(self, path: str | Path, model: str | None = None,
                     artifact_path: str | None = None) -> None:
        """Upload a file (now, or when the server is back: the latest version of it)."""
        path = Path(path)
        self._pending_artifacts[(model, artifact_path, path.name)] = (model, path, artifact_path)
        self._try()

    def log_flow(self, step: int, donors: list[str], receivers: list[str], flow) -> None:
        """The step's flow matrix F[donor, receiver] (groups moved): kept per step in
        ``flow_matrix.json`` in the run folder, uploaded to the parent run under ``exchange/``."""
        donor_index = {d: i for i, d in enumerate(donors)}
        matrix = [[int(flow[donor_index[d], donor_index[r]]) if r in donor_index else 0
                   for r in receivers] for d in donors]
        self.flows[step] = {"step": step, "donors": list(donors), "receivers": list(receivers),
                            "F": matrix}
        write_whole(self.flow_path, json.dumps({"layout": "F[donor][receiver] = groups moved at the step",
                                                "steps": [self.flows[s] for s in sorted(self.flows)]}))
        self.log_artifact(self.flow_path, artifact_path="exchange")

    def drain(self) -> None:
        """Nothing waits: this tracker writes in its caller's thread (``BackgroundTracker.drain`` waits)."""

    def finish(self, status: str = "FINISHED") -> None:
        """Last flush (even inside a retry pause) and the runs' end status."""
        def terminate():
            for run_id in [*self.child_ids.values(), self.parent_id]:
                self.client.set_terminated(run_id, status)
        if not self._try(terminate, force=True) and self._pending:
            self._warn(f"MLflow tracking at {self.shown_uri} was unreachable at the end of the run: "
                       f"{len(self._pending) + self._dropped} metric values are only in {self.local_log}", stacklevel=2)
