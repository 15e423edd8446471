"""A small file written whole or not at all: under a hidden ``.<name>.tmp`` beside it, then renamed
over it (``os.replace`` is atomic on one filesystem), so a job killed mid-write, or a full disk,
leaves the earlier file, never a cut one that a resume or a report would then fail to read."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """``path`` holds ``text`` whole, or what it held before."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    """``path``'s JSON object; {} where there is none or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
