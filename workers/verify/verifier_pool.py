"""The verifier actors: ``VerifierActor`` holds one verifier in a Ray actor, ``VerifierPool``
spreads batches over several and settles what it can in the driver."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from workers.verify.verifier import Item, Verdict, make_verifier, verify_many

if TYPE_CHECKING:
    import ray

# ----------------------------------------------------------------------------- Ray


class VerifierActor:
    """Holds one verifier inside a Ray actor (and so one math-verify child per actor).

    A plain class: wrap it at the use site, ``ray.remote(num_cpus=...)(VerifierActor)``, as
    ``VerifierPool`` does, so that importing this module needs no Ray.
    """

    def __init__(self, verifier: str = "math", **params: Any) -> None:
        self._verifier = make_verifier(verifier, **params)

    def verify_batch(self, pairs: Sequence[Item]) -> list[Verdict]:
        return verify_many(self._verifier, pairs)

    def ping(self) -> bool:
        return True


class VerifierPool:
    """``num_actors`` VerifierActors; a batch is cut into contiguous, near-equal chunks, one
    per actor, and the verdicts come back in input order.

    Contiguous chunks keep a prompt's n responses together, so each child parses that gold
    answer once. ``num_cpus_per_actor`` is Ray's bookkeeping only: the actor mostly waits on
    its child process, which uses up to a full core while judging. Needs ``ray.init()`` first.
    """

    def __init__(
        self,
        num_actors: int,
        verifier: str = "math",
        timeout_s: float = 2.0,
        num_cpus_per_actor: float = 0.25,
        fast_path: bool = True,
        **params: Any,
    ) -> None:
        import ray

        if num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {num_actors}")
        # fail fast, in the driver; and the fast path: what it settles never makes a round trip
        self._local = make_verifier(verifier, timeout_s=timeout_s, **params)
        check = getattr(self._local, "check", None)
        if getattr(self._local, "check_at_start", getattr(self._local, "takes_context", False)) and callable(check):
            try:  # a plugin: loaded once in a child process (judging nothing), then stopped
                check()
            finally:
                self._local.close()
        self.takes_context = bool(getattr(self._local, "takes_context", False))
        self.fast_path = fast_path
        remote_cls = ray.remote(num_cpus=num_cpus_per_actor)(VerifierActor)
        self._spawn = lambda: remote_cls.remote(verifier, timeout_s=timeout_s, **params)
        self._actors = [self._spawn() for _ in range(num_actors)]

    @property
    def num_actors(self) -> int:
        return len(self._actors)

    @property
    def actors(self) -> list:
        return list(self._actors)

    def replace(self, index: int) -> None:
        """A new actor (same verifier and params) in place of actor ``index``, e.g. a dead one."""
        import ray

        ray.kill(self._actors[index])  # a no-op for a dead actor; stops a stuck one
        self._actors[index] = self._spawn()

    def verify_batch_async(self, pairs: Sequence[Item]) -> list[ray.ObjectRef]:
        """Submit ``pairs``; each ref resolves to the verdicts of one consecutive chunk, so
        concatenating ``ray.get(refs)`` gives the verdicts in input order. A ``Query``'s
        question and metadata travel only to a verifier that takes them (a plugin)."""
        pairs = list(pairs) if self.takes_context else [(item[0], item[1]) for item in pairs]
        n = len(self._actors)
        size, extra = divmod(len(pairs), n)
        refs = []
        start = 0
        for i, actor in enumerate(self._actors):
            stop = start + size + (1 if i < extra else 0)
            if stop > start:
                refs.append(actor.verify_batch.remote(pairs[start:stop]))
            start = stop
        return refs

    def verify_batch(self, pairs: Sequence[Item]) -> list[Verdict]:
        """Verdicts in input order (items: pairs or ``Query``). Pairs the verifier's ``settle`` decides (the fast path: an
        exact integer match, a response with no boxed answer, ...) are judged here in the
        driver; only the rest go to the actors, and none at all when nothing is left.
        ``fast_path=False`` sends every pair to the actors."""
        import ray

        settle = getattr(self._local, "settle", None) if self.fast_path else None
        verdicts: list[Verdict | None] = [None] * len(pairs)
        if callable(settle):
            for i, pair in enumerate(pairs):
                try:
                    verdicts[i] = settle(pair[0], pair[1])
                except Exception:  # noqa: BLE001 - the actor's verify never raises; let it judge
                    verdicts[i] = None
        todo = [i for i, v in enumerate(verdicts) if v is None]
        if todo:
            judged = (v for chunk in ray.get(self.verify_batch_async([pairs[i] for i in todo])) for v in chunk)
            for i, verdict in zip(todo, judged, strict=True):
                verdicts[i] = verdict
        return verdicts  # type: ignore[return-value]

    def shutdown(self) -> None:
        """Kill the actors (their math-verify children exit within a second on their own)."""
        import ray

        for actor in self._actors:
            ray.kill(actor)
        self._actors = []
