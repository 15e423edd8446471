"""The dispatch layer's driver side: a worker method, named by reference, called on a model's
actors of one role as the method declares (``workers.dispatch``), and its results collected.

Every call from the driver to a generation replica or a trainer rank goes through :func:`call`
(``ModelActors.on_replicas`` / ``on_trainers`` / ``on_replicas_at``): no ``actor.method.remote``
elsewhere. Each :class:`Dispatch` member has its :class:`Mode` in :data:`MODES`, how the
arguments reach the actors (``spread``) and how their results come back (``collect``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError

from graftpool.step_record import StepRecord
from workers.dispatch import Dispatch, dispatch_of, method_name
from workers.training.rank_share import rank_share

# An actor's death, as a call to it reports it: by Ray's error for a dead actor (which names the
# actor), or by the memory monitor's for a worker it killed to free memory (which names none)
DEATHS = (RayActorError, OutOfMemoryError)


def get_all(refs: list[ray.ObjectRef], peer_wait_s: float = 10.0) -> list:
    """``ray.get(refs)`` in order, but raising as soon as any of them fails (a dead
    data-parallel rank must not leave the driver waiting on a peer stuck in all_reduce).

    A rank's death can surface first as another rank's error (gloo: connection closed);
    then the others get ``peer_wait_s`` to report, and an actor death among them is what
    is raised, so that the caller sees which actor died."""
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready)  # raises the task's error, if any
        except DEATHS:
            raise
        except Exception as first:
            done, _ = ray.wait(pending, num_returns=len(pending), timeout=peer_wait_s) if pending else ([], [])
            for ref in done:
                try:
                    ray.get(ref)
                except DEATHS as death:
                    raise death from first
                except Exception:  # noqa: BLE001 - the first error is the one to report
                    pass
            raise
    return ray.get(list(refs))


def split_evenly(args: tuple, parts: int) -> list[tuple]:
    """The list arguments of a ``SPLIT`` call cut into ``parts`` near-equal contiguous slices
    (other arguments whole in each), as a rank takes its share (``workers.training.rank_share``);
    slices with nothing in them left out."""
    size = next(len(a) for a in args if isinstance(a, list))
    shares = (rank_share(size, i, parts) for i in range(parts))
    return [tuple(a[share] if isinstance(a, list) else a for a in args) for share in shares if share.start < share.stop]


def scatter(args: tuple, parts: int) -> list[tuple]:
    """The arguments of a ``SCATTER`` call for each of ``parts`` actors: item i of each list
    argument for actor i (a list of another length is an error), other arguments whole."""
    lengths = {len(a) for a in args if isinstance(a, list)}
    if lengths - {parts}:
        raise ValueError(f"a SCATTER call needs one item per actor ({parts}) in each list argument, got {sorted(lengths)}")
    return [tuple(a[i] if isinstance(a, list) else a for a in args) for i in range(parts)]


def shared(args: tuple, actors: int) -> tuple:
    """The same arguments for every actor: each put into the object store once where several take it."""
    return tuple(a if isinstance(a, ray.ObjectRef) else ray.put(a) for a in args) if actors > 1 else args


@dataclass(frozen=True)
class Mode:
    """How one :class:`Dispatch` member is carried out: ``spread(actor_count, args)`` gives each
    actor's arguments (an actor past the list's end gets no call), ``collect`` the results."""

    spread: Callable[[int, tuple], list[tuple]]
    collect: Callable[[list], Any]


def _same(count: int, args: tuple) -> list[tuple]:
    return [shared(args, count)] * count


def _first(results: list) -> Any:
    return results[0]


def _in_order(results: list) -> list:
    return results


MODES: dict[Dispatch, Mode] = {
    Dispatch.ALL_RANKS: Mode(_same, _first),
    Dispatch.EACH_RANK: Mode(_same, _in_order),
    Dispatch.RANK0: Mode(lambda count, args: [args][:count], _first),
    Dispatch.SPLIT: Mode(lambda count, args: split_evenly(args, count), StepRecord.concat),
    Dispatch.EACH_REPLICA: Mode(_same, _in_order),
    Dispatch.SCATTER: Mode(lambda count, args: scatter(args, count), _in_order),
}


@dataclass
class Pending:
    """Calls in flight on a model's actors, and how their results are collected (the method's
    declared :class:`Dispatch`). ``get()`` waits (:func:`get_all`) and collects."""

    refs: list[ray.ObjectRef]
    mode: Dispatch

    def get(self) -> Any:
        return MODES[self.mode].collect(get_all(self.refs))


def raise_if_dead(actor: ray.actor.ActorHandle) -> None:
    """Ray's ``RayActorError`` naming ``actor`` if it is dead; nothing if it lives (a no-op call
    that runs no method of its class, so it declares no dispatch mode)."""
    ray.get(actor.__ray_call__.remote(lambda _: None))


def get_each(pending: dict[str, Pending]) -> dict[str, Any]:
    """Several models' calls collected together: :func:`get_all` over all their refs first, so that
    one model's death that surfaces first as another model's error is raised as that death (a
    receiver's ``train`` fetches per-token log-probs its donor's trainer rank owns; the rank dead,
    the fetch fails with Ray's ``OwnerDiedError``, which is no death of the receiver's). Then each
    model's results, collected as its method declares."""
    get_all([ref for calls in pending.values() for ref in calls.refs])
    return {name: calls.get() for name, calls in pending.items()}


def call(cls: type, actors: list, modes: frozenset[Dispatch], method: Callable, args: tuple,
         kwargs: dict[str, Any]) -> Pending:
    """``method`` (a function of ``cls``, the actors' class) on ``actors`` as it declares; its
    declaration must be one of ``modes`` (the role's: ``workers.dispatch.RANK_MODES`` or
    ``REPLICA_MODES``) and the arguments must fit its signature, else an error here, at the call."""
    name = method_name(cls, method)
    mode = dispatch_of(cls, name)
    if mode not in modes:
        raise TypeError(f"{cls.__name__}.{name} declares {mode}, not a mode of these actors "
                        f"({sorted(m.name for m in modes)})")
    try:
        inspect.signature(getattr(cls, name)).bind(None, *args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{cls.__name__}.{name}: {exc}") from None
    refs = [getattr(actor, name).remote(*part, **kwargs)
            for actor, part in zip(actors, MODES[mode].spread(len(actors), args), strict=False)]
    return Pending(refs, mode)
