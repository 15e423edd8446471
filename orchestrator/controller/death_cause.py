"""What the job's output says of an actor's death (the stop line, each restart's warning): the
error's first line and, for an actor whose ``__init__`` raised, the exception it raised, which the
output has nowhere else (actors do not log to the driver); for a system death (its worker process
killed, its node lost), Ray's reason for it."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of Ray's "ray::Actor.__init__()"
_FIELDS = ("class_name:", "actor_id:", "pid:", "name:", "namespace:", "ip:")  # ActorDiedError's context lines
LIMIT = 400  # characters of what a death line quotes of Ray's error


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
    return _cut(" ".join(line.strip() for line in lines[start:]))


def system_cause(exc: BaseException) -> str | None:
    """Ray's reason for a death that is not an ``__init__``'s exception: the error's lines after its
    first, less ``ActorDiedError``'s context fields (class name, ids, pid, namespace, ip), joined, at
    most 400 characters; None where there are none. Ray 2.60's: "The actor is dead because its worker
    process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: ..." (killed by the kernel's
    OOM killer, crashed, or stopped by Ray's memory monitor: the detail names which) or "The actor died
    because its node has died. Node Id: ... the actor's node was terminated unexpectedly: ..."; an
    ``OutOfMemoryError``'s node memory and threshold. Its first line alone ("The actor died
    unexpectedly before finishing this task.") names no cause, and a lost node's logs go with it."""
    if getattr(exc, "actor_init_failed", False):
        return None
    lines = [line.strip() for line in _ANSI.sub("", str(exc)).strip().splitlines()[1:] if line.strip()]
    reason = [line for line in lines if not line.startswith(_FIELDS)]
    return _cut(" ".join(reason)) if reason else None


def _cut(text: str) -> str:
    return text if len(text) <= LIMIT else text[:LIMIT - 3] + "..."


def death_line(exc: BaseException) -> str:
    """What the stop line says of a death: the error's first line (for an ``__init__`` that raised,
    Ray's "error raised in its creation task"), then the exception raised there (:func:`init_error`),
    or Ray's reason for a system death (:func:`system_cause`)."""
    first = (_ANSI.sub("", str(exc)).strip().splitlines() or [type(exc).__name__])[0]
    raised = init_error(exc)
    if raised:
        return f"{first}: {raised}"
    cause = system_cause(exc)
    return f"{first} {cause}" if cause else first


def death_cause(exc: BaseException) -> str:
    """What a restart's warning says of a death: the error's type, then the exception an ``__init__``
    raised or Ray's reason for a system death."""
    said = init_error(exc) or system_cause(exc)
    return type(exc).__name__ + (f": {said}" if said else "")
