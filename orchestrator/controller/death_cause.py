"""What the job's output says of an actor's death (the stop line, each restart's warning): the
error's first line and, for an actor whose ``__init__`` raised, the exception it raised, which the
output has nowhere else (actors do not log to the driver)."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's "ray::Actor.__init__()"


def init_error(exc: BaseException) -> str | None:
    """The exception an actor's ``__init__`` raised (Ray's ``actor_init_failed``): the traceback's lines
    after its last frame (the first line there not indented), joined, at most 400 characters; None for
    any other death. A message of several lines (pydantic's ``ValidationError``, which vLLM raises for
    settings it refuses) is named by its first, not by its last ("For further information visit ...").
    The job's output has it nowhere else: actors do not log to the driver."""
    lines = [line.rstrip() for line in _ANSI.sub("", str(exc)).splitlines() if line.strip()]
    if not getattr(exc, "actor_init_failed", False) or len(lines) < 2:
        return None
    frames = [i for i, line in enumerate(lines) if line.lstrip().startswith('File "')]
    start = next((i for i in range(frames[-1] + 1 if frames else 1, len(lines)) if not lines[i][0].isspace()),
                 len(lines) - 1)
    text = " ".join(line.strip() for line in lines[start:])
    return text if len(text) <= 400 else text[:397] + "..."


def death_line(exc: BaseException) -> str:
    """What the stop line says of a death: the error's first line (for an ``__init__`` that raised,
    Ray's "error raised in its creation task"), then the exception raised there (:func:`init_error`)."""
    first = (_ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__])[0]
    raised = init_error(exc)
    return f"{first}: {raised}" if raised else first
