"""Local data files (JSON, JSON Lines, Parquet, CSV, Arrow) read into :class:`~graftpool.tasks.Problem`
records, their columns mapped (:func:`load_table`), and a seeded train / eval split of them
(:func:`split_train_eval`). Local paths only: nothing is downloaded."""

from __future__ import annotations

import csv
import json
import random
from collections.abc import Sequence
from pathlib import Path

from graftpool.tasks import INSTRUCTION, Problem, make_problem


def split_train_eval(
    problems: Sequence[Problem], eval_fraction: float, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Shuffle-split loaded problems into train and eval with no prompt text in both.

    Duplicate prompts are kept on one side only (first occurrence wins), so a dataset
    with repeated questions cannot leak across the split.
    """
    if not 0.0 <= eval_fraction <= 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1], got {eval_fraction}")
    seen: set[str] = set()
    deduped = [p for p in problems if not (p.prompt in seen or seen.add(p.prompt))]
    order = list(range(len(deduped)))
    random.Random(seed).shuffle(order)
    eval_idx = set(order[: round(eval_fraction * len(deduped))])
    train = [p for i, p in enumerate(deduped) if i not in eval_idx]
    held = [p for i, p in enumerate(deduped) if i in eval_idx]
    return train, held


# -- loaders for local files --------------------------------------------------------------


def _read_json_lines(path: Path) -> list[dict]:
    """One JSON value per non-empty line; a bad line is named by its number."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno} is not valid JSON: {e}") from e
    return rows


FILE_SUFFIXES = (".json", ".jsonl", ".parquet", ".csv", ".arrow")
"""What :func:`read_table` reads (the ``datasets`` library's local formats; no download)."""


def read_table(path: str | Path) -> tuple[list[dict], list[str]]:
    """Rows and column names of a local file: ``.jsonl`` / ``.json`` (JSON Lines, or one JSON
    array of objects), ``.parquet``, ``.csv`` (every value read as text, so answers keep their
    spelling: ``0.50`` stays ``0.50``) or ``.arrow`` (Arrow IPC, stream or file, as
    ``datasets`` writes them). pyarrow and the standard library only."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".json" and path.read_text(encoding="utf-8").lstrip().startswith("["):
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON: {e}") from e
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError(f"{path}: a JSON array of objects (one per row) is expected")
    elif suffix in {".jsonl", ".json"}:
        rows = _read_json_lines(path)
    elif suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        return table.to_pylist(), list(table.column_names)
    elif suffix == ".csv":
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            rows = [dict(r) for r in reader]
            return rows, list(reader.fieldnames or [])
    elif suffix == ".arrow":
        import pyarrow as pa

        try:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
        return table.to_pylist(), list(table.column_names)
    else:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FILE_SUFFIXES)}")
    columns: dict[str, None] = {}
    for i, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: row {i} is not an object")
        columns.update(dict.fromkeys(row))
    return rows, list(columns)


def nested_value(path: Path, row: int, column: str, which: str, value: object) -> str:
    """The error for a mapped column whose value is a list or a mapping (a Parquet list or
    struct, a JSON array or object), which as text would be its Python repr: a question of
    chat messages (verl's ``prompt``), a gold answer ``{'ground_truth': '42', ...}`` that no
    response matches."""
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return (f"{path}: row {row}: column {column!r} ({which}) holds a {type(value).__name__}, not text: {shown}; "
            f"map a column of plain text, writing a nested value (e.g. verl's chat-message 'prompt' or "
            f"'reward_model' with its 'ground_truth') into a column of its own first")


def load_table(
    path: str | Path,
    question_field: str = "problem",
    answer_field: str = "answer",
    id_field: str | None = None,
    task_field: str | None = None,
    split: str | None = None,
    split_field: str = "split",
    task: str | None = None,
    instruction: str = INSTRUCTION,
) -> list[Problem]:
    """Problems from a local data file (:func:`read_table`), columns mapped by name.

    ``question_field`` and ``answer_field`` hold the question and the gold answer;
    ``id_field`` (optional) unique prompt ids; ``task_field`` (optional) each row's task, else
    ``task`` or the file's stem; ``split`` keeps the rows whose ``split_field`` equals it. A
    mapped column the file lacks raises ValueError naming the field, the column and the columns
    there are; so do an empty value (by the file's row, numbered from 1, whatever ``split`` keeps), a repeated id and
    no rows.
    The other columns become each problem's ``metadata``."""
    path = Path(path)
    rows, columns = read_table(path)
    if not rows:  # an empty file has no columns either: say what is wrong with it first
        raise ValueError(f"{path}: no rows")
    mapped = {"question_field": question_field, "answer_field": answer_field, "id_field": id_field,
              "task_field": task_field, "split_field": split_field if split is not None else None}
    for which, column in mapped.items():
        if column is not None and column not in columns:
            raise ValueError(f"{path}: no column {column!r} ({which}); the columns are {columns}")
    numbered = list(enumerate(rows, 1))  # the file's row numbers, which an error names, kept through the split
    if split is not None:
        values = sorted({str(r.get(split_field)) for r in rows})
        numbered = [(i, r) for i, r in numbered if r.get(split_field) is not None and str(r.get(split_field)) == split]
        if not numbered:
            raise ValueError(f"{path}: no rows with {split_field} == {split!r}; its values are {values}")
    used = {c for c in mapped.values() if c is not None}
    texts = {column: which for which, column in mapped.items() if column is not None and which != "split_field"}
    out, ids = [], set()
    for i, row in numbered:
        for column, which in texts.items():
            value = row.get(column)
            if value is None or str(value).strip() == "":
                raise ValueError(f"{path}: row {i} has no {column!r}")
            if isinstance(value, dict | list | tuple):
                raise ValueError(nested_value(path, i, column, which, value))
        prompt_id = None
        if id_field is not None:
            prompt_id = str(row[id_field]).strip()
            if prompt_id in ids:
                raise ValueError(f"{path}: row {i}: id {prompt_id!r} ({id_field!r}, id_field) is repeated")
            ids.add(prompt_id)
        name = str(row[task_field]).strip() if task_field else task or path.stem
        metadata = {k: v for k, v in row.items() if k not in used}
        out.append(make_problem(name, str(row[question_field]), str(row[answer_field]).strip(),
                                instruction=instruction, prompt_id=prompt_id, metadata=metadata))
    return out
