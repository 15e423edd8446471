"""How a call on one model's actors is spread over them and collected, declared once on the
worker's method (as verl's ``@register(dispatch_mode=...)``), never at the call site.

A model has generation replicas and data-parallel trainer ranks. Each public method of the
generation worker and of the trainer declares its :class:`Dispatch`; the controller's
``ModelActors.call`` reads the declaration and does the rest (``orchestrator.cluster.model_actors``).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeVar

F = TypeVar("F", bound=Callable)


class Dispatch(Enum):
    """How a call is spread over a model's actors of one role, and what comes back."""

    ALL_RANKS = "every rank gets the same arguments (put in the object store once); rank 0's result"
    EACH_RANK = "every rank gets the same arguments; every rank's result, in rank order"
    RANK0 = "rank 0 alone"
    SPLIT = "the list arguments cut into near-equal contiguous parts, one per replica; the records concatenated"
    EACH_REPLICA = "every replica gets the same arguments; every replica's result, in order"


def dispatch(mode: Dispatch) -> Callable[[F], F]:
    """Declare how a worker method is called on a model's actors."""

    def mark(method: F) -> F:
        method.dispatch = mode  # type: ignore[attr-defined]
        return method

    return mark


def dispatch_of(cls: type, method: str) -> Dispatch:
    """The mode ``cls.method`` declares, or the nearest base class's declaration of it (an
    override inherits it); a method that declares none is an error naming it."""
    if getattr(cls, method, None) is None:
        raise AttributeError(f"{cls.__name__} has no method {method!r}")
    for klass in cls.__mro__:
        mode = getattr(klass.__dict__.get(method), "dispatch", None)
        if isinstance(mode, Dispatch):
            return mode
    raise TypeError(f"{cls.__name__}.{method} declares no dispatch mode (workers.dispatch.dispatch)")
