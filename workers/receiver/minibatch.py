"""Where peer groups go among a step's minibatches: ``exchange.peer_placement`` (a registry).

- ``last`` (the paper, docs/algorithm.md section 2, "Peer-last updates", the default): minibatches that hold
  grafted (peer) groups are processed after the minibatches that hold only the receiver's
  own groups, so that by the time peer tokens are seen the ratio rho has moved off 1 and
  clipping can act. With many grafts the last minibatch can hold peer rows only: an update of
  its own, normalised on peer tokens alone (under ``groups`` as soon as grafts fill more than a
  chunk of groups; under ``rows`` only when peer rows fill more than a minibatch's rows).
- ``first``: the paper's peer-first ablation (``exchange.peer_placement: first``).
- ``spread`` (beyond the paper): the own groups are cut into the minibatches first, then the
  peer groups are dealt one at a time to the minibatches from the last one backwards, so peer
  groups still come late but no minibatch is peer-only (while there are own groups), and the
  receiver takes as many updates as it would with no exchange. (That holds for the placement's
  minibatches of groups, ``split: groups``; ``rows`` re-cuts the rows, and a last run can be
  peer rows only when the peer groups dealt to the last minibatch hold more rows than a run.)

How the ordered groups become minibatches of rows is ``algorithm.minibatch_split``
(:data:`SPLITS`, :func:`minibatch_rows`):

- ``rows`` (the default, as verl cuts a batch into ``ppo_mini_batch_size`` pieces): the groups'
  trained rows, in the placement's order, are cut into ``minibatches`` near-equal runs of rows.
  Peer rows join own rows at the seam, a group whose responses the gate dropped leaves no empty
  slot, and a step takes ``minibatches`` optimizer steps whenever it has that many rows, with or
  without an exchange: a control (the gate closed) takes as many updates as the row it controls.
- ``groups``: the placement's minibatches of groups as they are. A group with no trained row
  (every response gated out) still holds its place, so a step can take fewer updates, and with
  many grafts the last minibatch is peer-only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypeVar, get_args

import numpy as np

from graftpool.registry import Registry

Placement = Callable[[np.ndarray, np.ndarray, int], list[list[int]]]
"""(own group indices, peer group indices, minibatches) -> ordered minibatches of group indices."""

PLACEMENTS: Registry[Placement] = Registry("peer placement", "exchange.peer_placement", in_actors="the trainer ranks")
register_placement = PLACEMENTS.register


def _cut(ordered: np.ndarray, num_minibatches: int) -> list[list[int]]:
    """``ordered`` in near-equal contiguous chunks; empty chunks are left out."""
    chunks = np.array_split(ordered.astype(int), min(num_minibatches, max(len(ordered), 1)))
    return [chunk.tolist() for chunk in chunks if len(chunk)]


@register_placement("last")
def peer_last(own: np.ndarray, peer: np.ndarray, num_minibatches: int) -> list[list[int]]:
    """Own groups first, peer groups last, cut by group count (the paper)."""
    return _cut(np.concatenate([own, peer]), num_minibatches)


@register_placement("first")
def peer_first(own: np.ndarray, peer: np.ndarray, num_minibatches: int) -> list[list[int]]:
    """Peer groups first, own groups last (the paper's peer-first ablation)."""
    return _cut(np.concatenate([peer, own]), num_minibatches)


@register_placement("spread")
def peer_spread(own: np.ndarray, peer: np.ndarray, num_minibatches: int) -> list[list[int]]:
    """Own groups cut into minibatches; peer group j joins minibatch K-1-(j mod K) (K of them),
    after that minibatch's own groups. With no own group at all, the peer groups are cut alone."""
    batches = _cut(own, num_minibatches)
    if not batches:
        return _cut(peer, num_minibatches)
    for j, group in enumerate(peer.tolist()):
        batches[len(batches) - 1 - j % len(batches)].append(group)
    return batches


def order_minibatches(
    group_is_peer: Sequence[bool],
    num_minibatches: int,
    placement: str = "last",
    rng: np.random.Generator | None = None,
) -> list[list[int]]:
    """Split group indices into at most ``num_minibatches`` ordered minibatches by the
    registered ``placement``. With ``rng`` the groups are shuffled within the own and within
    the peer class first. Empty minibatches (more minibatches than groups) are left out."""
    if num_minibatches < 1:
        raise ValueError(f"algorithm.minibatches must be >= 1, got {num_minibatches}")
    place = PLACEMENTS.get(placement)
    flags = np.asarray(group_is_peer, dtype=bool)
    own = np.flatnonzero(~flags)
    peer = np.flatnonzero(flags)
    if rng is not None:
        own = rng.permutation(own)
        peer = rng.permutation(peer)
    return place(own, peer, num_minibatches)


Split = Literal["rows", "groups"]
SPLITS: tuple[str, ...] = get_args(Split)
"""``algorithm.minibatch_split``: how the placement's ordered groups become minibatches of rows."""

Row = TypeVar("Row")


def minibatch_rows(
    group_rows: Sequence[Sequence[Row]],
    group_is_peer: Sequence[bool],
    num_minibatches: int,
    placement: str = "last",
    rng: np.random.Generator | None = None,
    split: str = "rows",
) -> list[list[Row]]:
    """The step's trained rows in ordered minibatches: the groups ordered by ``placement``
    (:func:`order_minibatches`, ``rng`` shuffling within the own and the peer class), then
    ``split``: ``rows`` cuts their rows, in that order, into ``num_minibatches`` near-equal runs
    (sizes differ by at most one row); ``groups`` keeps the placement's minibatches of groups.
    ``group_rows[g]`` are group g's trained rows (none: every response was gated out). Empty
    minibatches are left out."""
    if split not in SPLITS:
        raise ValueError(f"algorithm.minibatch_split: expected one of {list(SPLITS)}, got {split!r}")
    ordered = order_minibatches(group_is_peer, num_minibatches, placement, rng)
    by_group = [[row for g in minibatch for row in group_rows[g]] for minibatch in ordered]
    if split == "groups":
        return [rows for rows in by_group if rows]
    flat = [row for rows in by_group for row in rows]
    cuts = np.array_split(np.arange(len(flat)), min(num_minibatches, max(len(flat), 1)))
    return [[flat[i] for i in cut] for cut in cuts if len(cut)]
