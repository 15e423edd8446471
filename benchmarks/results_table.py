"""A benchmark's rows written as its results: ``<stem>.json`` (the rows as measured) and
``<stem>.md`` (a Markdown table of them), both under ``out``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path


def write_results(out: Path, stem: str, rows: list[dict], header: list[str],
                  cells: Callable[[dict], list[str]]) -> str:
    """Write ``rows`` to ``out/<stem>.json`` and, one line a row (``cells`` of it) under
    ``header``, to ``out/<stem>.md``; returns the table's text."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in rows]
    table = "\n".join(lines) + "\n"
    (out / f"{stem}.md").write_text(table)
    return table
