"""What the views show, as plain data, and where it is read from.

:class:`RunData` holds one job's metric series per model (and for the pool), read from the
controller's in-memory history (during training), from MLflow (a parent run and its
child runs) or from a run folder's ``metrics.jsonl`` (when MLflow is out of reach). The
flow matrix is rebuilt from the receivers' ``exchange/from/<donor>`` series; the
complementarity matrix is computed from the trajectory store.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dashboards.metric_log import POOL, Series, put, read_metrics_jsonl, sorted_series
from dashboards.mlflow_basics import FAULT_TAG, RESUME_TAG, quick_http, safe_metric_name
from graftpool.redaction import redact_text, register_secrets_in


@dataclass
class RunData:
    name: str
    models: list[str]
    series: dict[str, dict[str, Series]]  # model (POOL: the parent run) -> metric -> [(step, value)]
    params: dict[str, str] = field(default_factory=dict)
    complementarity: dict | None = None
    run_id: str | None = None
    source: str = ""
    status: str = ""
    notes: list[str] = field(default_factory=list)
    faults: list[dict] = field(default_factory=list)  # actor deaths and recoveries, oldest first

    # -- series -----------------------------------------------------------------------

    def metric(self, model: str, key: str) -> Series:
        return self.series.get(model, {}).get(key, [])

    def steps(self) -> list[int]:
        return sorted({s for m in self.models for s, _ in self.metric(m, "train/reward_mean")})

    def eval_sets(self) -> list[str]:
        sets = {k.split("/")[1] for m in self.models for k in self.series.get(m, {})
                if k.startswith("eval/") and k.endswith("/pass_at_1")}
        return sorted(sets - {"avg"}) + (["avg"] if "avg" in sets else [])

    def donors(self) -> list[str]:
        extra = sorted({k[len("exchange/from/"):] for m in self.models for k in self.series.get(m, {})
                        if k.startswith("exchange/from/")} - set(self.models))
        return list(self.models) + extra

    def flow(self, first: int | None = None, last: int | None = None) -> np.ndarray:
        """Sum of F[donor, receiver] over steps first..last (inclusive; None: open)."""
        donors = self.donors()
        flow = np.zeros((len(donors), len(self.models)), dtype=float)
        for r, receiver in enumerate(self.models):
            for d, donor in enumerate(donors):
                for step, value in self.metric(receiver, f"exchange/from/{donor}"):
                    if (first is None or step >= first) and (last is None or step <= last):
                        flow[d, r] += value
        return flow

    def final(self, model: str, key: str) -> float | None:
        series = self.metric(model, key)
        return series[-1][1] if series else None

    def mean(self, model: str, key: str) -> float | None:
        values = [v for _, v in self.metric(model, key) if math.isfinite(v)]
        return float(np.mean(values)) if values else None

    def total(self, model: str, key: str) -> float:
        return float(sum(v for _, v in self.metric(model, key)))

    def peer_grad_share(self, model: str) -> float | None:
        """The mean of ``train/peer_grad_share`` over the model's steps, or None where a step with a
        mixed update (``train/updates_mixed`` > 0) has none: the DeepSpeed backend (and
        ``trainer.grad_parts: false``) cannot split a mixed update's gradient, the share is NaN
        there and not logged, so the steps that remain are those with no peer rows in any mixed
        update (share 0, or the peer-only updates' part) and their mean is not the run's."""
        logged = {step for step, _ in self.metric(model, "train/peer_grad_share")}
        if any(v > 0 and step not in logged for step, v in self.metric(model, "train/updates_mixed")):
            return None
        return self.mean(model, "train/peer_grad_share")


# -- from the controller (during training) ---------------------------------------------------


def from_history(name: str, models: list[str], history: list[dict], eval_history: list[dict],
                 complementarity: dict | None = None) -> RunData:
    """The controller's ``history`` (per step: ``models`` -> metrics, ``timings``) and
    ``eval_history`` (per eval step: ``scores`` -> model -> set -> pass@1)."""
    series: dict[str, dict[str, dict[int, list[float]]]] = {}
    for entry in history:
        step = entry["step"]
        for model, metrics in entry["models"].items():
            for key, value in metrics.items():
                if value is not None and math.isfinite(float(value)):
                    put(series, model, safe_metric_name(key), step, value)
        timings = entry.get("timings", {})
        for phase, value in timings.items():
            put(series, POOL, f"time/{phase}", step, value)
        if timings:
            put(series, POOL, "time/step", step, sum(timings.values()))
    for entry in eval_history:
        for model, scores in entry["scores"].items():
            for set_name, value in scores.items():
                put(series, model, safe_metric_name(f"eval/{set_name}/pass_at_1"), entry["step"], value)
    return RunData(name=name, models=list(models), series=sorted_series(series),
                   complementarity=complementarity, source="controller history")


# -- faults ------------------------------------------------------------------------------


def latest_faults(entries: list[dict]) -> list[dict]:
    """One entry per death (by its time; a recovery's entry replaces the death's), oldest first."""
    by_time: dict[float, dict] = {}
    for entry in entries:
        if "time" in entry:
            by_time[float(entry["time"])] = entry
    return [by_time[t] for t in sorted(by_time)]


def read_faults_jsonl(path: str | Path) -> list[dict]:
    """A run folder's ``faults.jsonl`` (``Tracker.log_fault``), one entry per death."""
    path = Path(path)
    if not path.is_file():
        return []
    return latest_faults([json.loads(line) for line in path.read_text().splitlines() if line.strip()])


def faults_from_tags(tags: dict[str, str]) -> list[dict]:
    """The ``graftpool.fault.<ms>`` tags of a job's MLflow run, one entry per death."""
    entries = []
    for key, value in tags.items():
        if key.startswith(FAULT_TAG):
            try:
                entries.append(json.loads(value))
            except ValueError:  # cut at MLflow's limit: the key still says when
                entries.append({"time": int(key[len(FAULT_TAG):]) / 1000, "action": value[:200]})
    return latest_faults(entries)


# -- from a run folder -------------------------------------------------------------------


def from_run_dir(run_dir: str | Path) -> RunData:
    """A run folder alone: ``metrics.jsonl``, ``config.yaml``, ``plots/complementarity.json``
    (or the trajectory store)."""
    run_dir = Path(run_dir)
    series = read_metrics_jsonl(run_dir / "metrics.jsonl")
    params: dict[str, str] = {}
    models = [m for m in series if m != POOL]
    config_path = run_dir / "config.yaml"
    if config_path.is_file():
        import yaml

        from dashboards.mlflow_basics import flatten_params

        config = yaml.safe_load(config_path.read_text())
        flatten_params("", config, params)
        models = [m["name"] for m in config.get("models", [])] or models
    comp_path = run_dir / "plots" / "complementarity.json"
    if comp_path.is_file():
        comp = json.loads(comp_path.read_text())
    else:
        comp = complementarity(run_dir / "trajectories") if (run_dir / "trajectories").is_dir() else None
    return RunData(name=run_dir.name, models=models, series=series, params=params,
                   complementarity=comp, source=f"run folder {run_dir} (metrics.jsonl)",
                   faults=read_faults_jsonl(run_dir / "faults.jsonl"))


# -- from MLflow -------------------------------------------------------------------------


def default_tracking_uri(runs_dir: str | Path = "runs") -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(Path(runs_dir) / 'mlflow.db').resolve()}"


def from_mlflow(run_id: str, tracking_uri: str | None = None) -> RunData:
    """A job's parent run (or any of its child runs) and its child runs, read with MlflowClient."""
    from mlflow.tracking import MlflowClient

    uri = tracking_uri or default_tracking_uri()
    register_secrets_in(uri)
    client = MlflowClient(tracking_uri=uri)
    with quick_http():
        run = client.get_run(run_id)
        parent_id = run.data.tags.get("mlflow.parentRunId")
        if parent_id:
            run = client.get_run(parent_id)
        parent = run.info.run_id
        children = client.search_runs([run.info.experiment_id], f"tags.mlflow.parentRunId = '{parent}'",
                                      max_results=1000)
        order = run.data.tags.get("graftpool.models", "").split(",")
        by_model = {c.data.tags.get("graftpool.model", c.info.run_name): c for c in children}
        models = [m for m in order if m in by_model] + sorted(set(by_model) - set(order))
        series: dict[str, dict[str, Series]] = {}
        resumes = resume_points(run.data.tags)
        for model, r in [(POOL, run), *((m, by_model[m]) for m in models)]:
            series[model] = {}
            for key in sorted(r.data.metrics):
                history = client.get_metric_history(r.info.run_id, key)
                points: dict[int, float] = {}
                for m in sorted(history, key=lambda m: (m.step, m.timestamp)):
                    if not superseded(int(m.step), int(m.timestamp), resumes):
                        points[int(m.step)] = float(m.value)
                if points:
                    series[model][key] = sorted(points.items())
        comp = _download_json(client, parent, "plots/complementarity.json")
    return RunData(name=run.info.run_name or parent, models=models, series=series,
                   params=dict(run.data.params), complementarity=comp, run_id=parent,
                   source=f"MLflow {redact_text(uri)}", status=run.info.status,
                   faults=faults_from_tags(run.data.tags))


def resume_points(tags: dict[str, str]) -> list[tuple[int, int]]:
    """The job's ``graftpool.resume.<ms>`` tags (``Tracker._tag_resume``) as (time in ms, step):
    each time the job went back to a checkpoint (a resumed job, an in-process recovery)."""
    points = []
    for key, value in tags.items():
        if key.startswith(RESUME_TAG):
            try:
                points.append((int(key[len(RESUME_TAG):]), int(value)))
            except ValueError:
                continue
    return sorted(points)


def superseded(step: int, timestamp_ms: int, resumes: list[tuple[int, int]]) -> bool:
    """Whether a value logged at ``timestamp_ms`` for ``step`` was superseded: a later resume went
    back to a step s < ``step`` (the values a killed job sent past its checkpoint, which MLflow
    keeps; until the resumed job logs that step again, or for good where it ends before it, they
    are not the run's: ``metrics.jsonl``'s ``start`` lines drop them the same way)."""
    return any(time_ms > timestamp_ms and step > back_to for time_ms, back_to in resumes)


def _download_json(client, run_id: str, artifact: str) -> dict | None:
    """A JSON artifact of a run, or None (a run stopped before its first view has none)."""
    import tempfile

    saved = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, artifact, tmp)).read_text())
    except Exception:  # noqa: BLE001
        return None
    finally:
        if saved is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = saved


def _sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` tracking URI (a relative PATH is the working
    folder's, as SQLAlchemy opens it), else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def folder_store(run_dir: Path, pointer_uri: str | None) -> tuple[str, str | None]:
    """The tracking URI a run folder's records are read from, and why none can be (else None).

    ``mlflow.json`` names the store the job wrote to, as the job's machine saw it: on a
    cluster the head's ``sqlite:////mnt/graftpool/runs/mlflow.db``. A folder copied off that
    machine (``ray rsync-down``, a copy from ``run.storage``) is read from a copy of the store
    brought with it: inside the folder, ``<run_dir>/mlflow.db`` (cluster.yaml's header copies it
    there, so that it replaces no local store), else beside it, ``<parent>/mlflow.db``, as the
    job's default layout has it. A sqlite file found in none of these places is never opened:
    MLflow would create an empty store there (a new ``/mnt/graftpool/runs/`` where the user may
    write) and find no run in it.
    """
    inside, beside = run_dir / "mlflow.db", run_dir.parent / "mlflow.db"
    db = _sqlite_file(pointer_uri) if pointer_uri else None
    if pointer_uri and (db is None or db.is_file()):
        return pointer_uri, None
    for copy in (inside, beside):
        if copy.is_file():
            return f"sqlite:///{copy.resolve()}", None
    if pointer_uri is None:
        return f"sqlite:///{beside.resolve()}", f"there is no MLflow store at {beside}"
    return pointer_uri, (f"the MLflow store {db} is not on this machine, nor a copy of it at {inside} "
                         f"or {beside} (a run folder copied from another machine without it)")


def store_behind(run_dir: Path, pointer: dict) -> str | None:
    """Why the run's MLflow runs lack steps its ``metrics.jsonl`` holds, else None.

    ``mlflow.json``'s ``caught_up_step`` c is the last step of a flush that left nothing to send
    (None: no such flush yet); with S the last step of ``metrics.jsonl`` (later lines superseding),
    c < S (or c None) means the store has none of steps c+1..S: a job whose store was out of
    reach at its end (its last warning says how many values are only in ``metrics.jsonl``), or one
    still sending. A pointer written before ``caught_up_step`` existed says nothing (None)."""
    log = run_dir / "metrics.jsonl"
    if "caught_up_step" not in pointer or not log.is_file():
        return None
    steps = [s for keys in read_metrics_jsonl(log).values() for values in keys.values() for s, _ in values]
    if not steps:
        return None
    caught, last = pointer["caught_up_step"], max(steps)
    if caught is not None and int(caught) >= last:
        return None
    held = "none of its steps" if caught is None else f"its steps up to {int(caught)} only"
    return (f"MLflow holds {held} (mlflow.json's caught_up_step), its metrics.jsonl steps up to {last}: "
            "the job's store was out of reach when it last logged")


def load_run(ref: str, tracking_uri: str | None = None) -> RunData:
    """``ref``: a run folder (its ``mlflow.json`` says where its MLflow records are, or a
    copy of that sqlite store in or beside the folder, :func:`folder_store`; if MLflow is out of
    reach, or lacks steps the folder's log holds (:func:`store_behind`), the folder's
    ``metrics.jsonl`` is used, with a warning and a note) or an MLflow
    run id (``tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``runs/mlflow.db``).

    ``mlflow.json`` holds the tracking URI without its password (user and host only): a
    server that asks for one gets it from MLflow's own ``MLFLOW_TRACKING_USERNAME`` /
    ``MLFLOW_TRACKING_PASSWORD`` variables, or give the full URI as ``tracking_uri``
    (``--tracking-uri``). Messages about the URI are redacted (``graftpool.redaction``)."""
    path = Path(ref)
    if not path.is_dir():
        return from_mlflow(ref, tracking_uri)
    pointer_path = path / "mlflow.json"
    pointer = json.loads(pointer_path.read_text()) if pointer_path.is_file() else {}
    run_id = pointer.get("parent_run_id")
    if run_id is None and (path / "summary.json").is_file():
        run_id = json.loads((path / "summary.json").read_text()).get("mlflow_run_id")
    uri, missing = tracking_uri, None
    if uri is None:
        uri, missing = folder_store(path, pointer.get("tracking_uri"))
    reason = "the run folder names no MLflow run" if missing is None else missing
    if run_id and missing is None:
        missing = store_behind(path, pointer)
        reason = missing or reason
    if run_id and missing is None:
        try:
            data = from_mlflow(run_id, uri)
        except Exception as exc:  # noqa: BLE001
            reason = (f"MLflow at {redact_text(uri)} could not be read "
                      f"({type(exc).__name__}: {redact_text(str(exc))[:200]})")
        else:
            comp_path = path / "plots" / "complementarity.json"
            if data.complementarity is None and comp_path.is_file():  # a moved store's artifacts are not there
                data.complementarity = json.loads(comp_path.read_text())
            return data
    warnings.warn(f"{reason}; reading {path / 'metrics.jsonl'} instead", stacklevel=2)
    data = from_run_dir(path)
    data.run_id = run_id
    data.notes.append(f"{reason}; this report was read from the run folder's local copy of the metrics.")
    return data


# -- complementarity -------------------------------------------------------------------------


def complementarity(store_dir: str | Path, models: list[str] | None = None,
                    step: int | None = None) -> dict | None:
    """For each pair (A, B): among A's all-fail groups (step, prompt: no own response of A
    correct), the fraction where B's own group on the same step and prompt has k >= 1.

    Returns ``{"models", "all_fail": [n_A], "solved": [[count]], "C": [[fraction or None]]}``
    (None on the diagonal and where A had no all-fail group), or None without a store.
    ``step`` restricts it to one training step (the curve over training).
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    store_dir = Path(store_dir)
    if not store_dir.is_dir() or not any(store_dir.glob("step_*.parquet")):
        return None
    table = ds.dataset(str(store_dir), format="parquet").to_table(
        columns=["step", "model", "prompt_id", "reward"],
        filter=(ds.field("kind") == "own") if step is None else
        ((ds.field("kind") == "own") & (ds.field("step") == step)))
    table = table.append_column("ok", pc.cast(pc.greater(table["reward"], 0.5), "int64"))
    k_table = table.group_by(["step", "model", "prompt_id"]).aggregate([("ok", "sum")])
    k: dict[str, dict[tuple[int, str], int]] = {}
    for step, model, prompt_id, ok in zip(*(k_table[c].to_pylist() for c in
                                            ("step", "model", "prompt_id", "ok_sum")), strict=True):
        k.setdefault(model, {})[(step, prompt_id)] = ok
    models = [m for m in (models or sorted(k)) if m in k]
    all_fail = [sum(1 for v in k[a].values() if v == 0) for a in models]
    solved = [[sum(1 for key, v in k[a].items() if v == 0 and k[b].get(key, 0) >= 1) if a != b else 0
               for b in models] for a in models]
    fraction = [[solved[i][j] / all_fail[i] if i != j and all_fail[i] else None
                 for j in range(len(models))] for i in range(len(models))]
    return {"models": models, "all_fail": all_fail, "solved": solved, "C": fraction,
            "definition": "C[A][B] = fraction of A's all-fail (step, prompt) groups where B's own group "
                          "on that step and prompt has at least one correct response"}
