"""How a call on one model's actors is spread over them and collected, declared once on the
worker's method (as verl's ``@register(dispatch_mode=...)``), never at the call site.

A model has generation replicas and data-parallel trainer ranks. Each public method of the
generation worker and of the trainer declares its :class:`Dispatch`; the driver names the method
by reference (``actors.on_trainers(TorchTrainer.score, record)``) and the dispatch layer
(``orchestrator.cluster.actor_calls``, through ``ModelActors``) reads the declaration and does the
rest. A method that declares none, or a mode of the other role, is an error at the call.
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
    SCATTER = "replica i gets item i of each list argument (one item per replica); every replica's result, in order"


RANK_MODES = frozenset({Dispatch.ALL_RANKS, Dispatch.EACH_RANK, Dispatch.RANK0})
"""The modes of a trainer method (its actors are the data-parallel ranks)."""

REPLICA_MODES = frozenset({Dispatch.SPLIT, Dispatch.EACH_REPLICA, Dispatch.SCATTER})
"""The modes of a generation worker method (its actors are the replicas)."""


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


def method_name(cls: type, method: Callable) -> str:
    """The name under which ``cls`` (an actor's class) has ``method``, a function of ``cls`` or of a
    base class it overrides (the actor runs its own override); anything else (a string, another
    class's method) is an error at the call."""
    name = getattr(method, "__name__", None)
    if not isinstance(name, str) or not any(k.__dict__.get(name) is method for k in cls.__mro__):
        raise TypeError(f"{method!r} is not a method of {cls.__name__}: name it by reference "
                        f"(e.g. {cls.__name__}.{name if isinstance(name, str) else 'node_id'})")
    return name
