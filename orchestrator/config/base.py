"""Safe names and the error a user sees, for every config section (the sections' strict model, where an
unknown key is an error, is ``graftpool.sections.Strict``)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _check_safe_name(name: str) -> str:
    if not SAFE_NAME.match(name):
        raise ValueError("use letters, digits, '_', '-' and '.' only (it names MLflow runs and folders)")
    if not name.strip("."):
        raise ValueError(f"{name!r} names no folder of its own ('.' is this folder, '..' the one above); "
                         "use a letter or digit")
    return name


SafeName = Annotated[str, AfterValidator(_check_safe_name)]
"""A model or run name: it names MLflow runs, run folders and checkpoint folders."""


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: field path and what was expected."""


