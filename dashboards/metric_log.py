"""A run folder's ``metrics.jsonl`` (``dashboards.tracking.Tracker``) read back as metric series,
per model (:data:`POOL`: the job's own, pool-level ones), for the views and reports of a run
whose MLflow store is out of reach, and for the tracker itself, which replays it into new runs."""

from __future__ import annotations

import json
from pathlib import Path

Series = list[tuple[int, float]]
POOL = ""  # the key of the parent run's (pool-level) series
EVENTS = "faults/"
"""The prefix of the metrics logged once per event (an actor's death, its recovery:
``Tracker.log_fault``; the restart counts): several at one step are each kept (two deaths of one
node's actors), not the last taken for the step's value, and a job going back to an earlier step
(a resume, a recovery) keeps those past it (the deaths stay on record, as in ``faults.jsonl``), so
that a replay into new runs sends every one."""


def end_at_a_line(path: str | Path) -> int:
    """Drop a last line cut short (bytes after the file's last newline) from a JSON-lines record,
    so that what is appended next starts a line of its own; returns the bytes dropped (0: none).

    A record copied to a path ``run.storage`` is written in place, so a job stopped during the copy
    leaves a fragment there; a job resumed from that storage appended its ``start`` line to the
    fragment, and every later read of the file (the tracker's replay into new MLflow runs,
    ``dashboards report``) failed on the joined line. The fragment belongs to a step past the
    checkpoint the job resumes from, which its segment supersedes anyway."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    with path.open("r+b") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return 0
        data = path.read_bytes()  # cut short: find the last whole line
        keep = data.rfind(b"\n") + 1
        f.truncate(keep)
    return len(data) - keep


def put(series: dict[str, dict[str, dict[int, list[float]]]], model: str, key: str, step: int,
        value: float) -> None:
    """A later value for the step replaces the earlier one; an event's (:data:`EVENTS`) joins it."""
    values = series.setdefault(model, {}).setdefault(key, {})
    values[int(step)] = [*values.get(int(step), []), float(value)] if key.startswith(EVENTS) else [float(value)]


def sorted_series(series: dict[str, dict[str, dict[int, list[float]]]]) -> dict[str, dict[str, Series]]:
    return {m: {k: [(s, x) for s in sorted(v) for x in v[s]] for k, v in keys.items()} for m, keys in series.items()}


def _drop(series: dict[str, dict[str, dict[int, list[float]]]], superseded, kept: str | None) -> None:
    """Forget the values at the steps ``superseded`` says, but for keys that start with ``kept``."""
    for keys in series.values():
        for values in (v for k, v in keys.items() if kept is None or not k.startswith(kept)):
            for s in [s for s in values if superseded(s)]:
                del values[s]


def read_metrics_jsonl(path: str | Path) -> dict[str, dict[str, Series]]:
    """``metrics.jsonl`` as series. Each ``start`` line opens a segment (a new run or a
    resumed one under the same folder); a segment whose first step is s supersedes what
    earlier segments logged for steps >= s, and a resumed one's (``resumed_from_step`` r) what they
    logged for steps > r from its start, before it logs any; a resumed one keeps their
    :data:`EVENTS` (the deaths that sent the job back among them)."""
    series: dict[str, dict[str, dict[int, list[float]]]] = {}
    segment_started, kept = False, None
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if record.get("event") == "start":
            segment_started = True
            # a job gone back to a step keeps its deaths past it (:data:`EVENTS`); a new run, none
            kept = EVENTS if "resumed_from_step" in record else None
            if kept:  # went back to that step: what was logged past it is superseded
                _drop(series, lambda s, at=int(record["resumed_from_step"]): s > at, kept)
            continue
        step = int(record["step"])
        if segment_started:
            _drop(series, lambda s, at=step: s >= at, kept)
            segment_started = False
        model = record.get("model") or POOL
        for key, value in record["metrics"].items():
            put(series, model, key, step, value)
    return sorted_series(series)


def values_between(path: Path, models: list[str], first: int | None, last: int) -> list[tuple[str | None, str, int, float]]:
    """(model or None for the pool's, key, step, value) of every value ``metrics.jsonl`` holds for
    steps ``first`` (None: the first) to ``last`` (later lines superseding, as the reports read it),
    of the job's own series and ``models``' ([] without the file), and its :data:`EVENTS` from
    ``first`` on past ``last`` too: the deaths after the checkpoint stay on record (``faults.jsonl``,
    ``summary.json``, their tags) and the resumed job, which goes on from ``last``, never logs them
    again. The tracker replays them for a resumed job: into new runs where its store lacks the old
    ones (a job resumed from ``run.storage`` on a new head: the log came with the checkpoint, or with
    the records a death that stopped the run uploaded; a job that never reached its store), or into
    the reopened runs from the step the killed job's store had last caught up at (values sent twice
    are equal: a report takes one)."""
    if not path.is_file():
        return []
    return [(model or None, key, step, value)
            for model, keys in read_metrics_jsonl(path).items() if not model or model in models
            for key, series in keys.items() for step, value in series
            if (first is None or step >= first) and (step <= last or key.startswith(EVENTS))]
