"""Minibatch order for one optimisation epoch: peer-last (GRAFT_SPEC section 2, step 8).

Minibatches that hold grafted (peer) groups are processed after the minibatches that
hold only the receiver's own groups, so that by the time peer tokens are seen the
ratio rho has moved off 1 and clipping can act. ``peer_last=False`` is the peer-first
ablation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def order_minibatches(
    group_is_peer: Sequence[bool],
    num_minibatches: int,
    peer_last: bool = True,
    rng: np.random.Generator | None = None,
) -> list[list[int]]:
    """Split group indices into ``num_minibatches`` ordered minibatches.

    Own groups come first and peer groups last (reversed when ``peer_last`` is False);
    the ordered list is cut into near-equal contiguous chunks, so every own-only
    minibatch precedes every minibatch that contains a peer group. With ``rng`` the
    groups are shuffled within the own and within the peer class first. Empty chunks
    (more minibatches than groups) are left out.
    """
    if num_minibatches < 1:
        raise ValueError(f"algorithm.minibatches must be >= 1, got {num_minibatches}")
    flags = np.asarray(group_is_peer, dtype=bool)
    own = np.flatnonzero(~flags)
    peer = np.flatnonzero(flags)
    if rng is not None:
        own = rng.permutation(own)
        peer = rng.permutation(peer)
    ordered = np.concatenate([own, peer] if peer_last else [peer, own]).astype(int)
    chunks = np.array_split(ordered, min(num_minibatches, max(len(ordered), 1)))
    return [chunk.tolist() for chunk in chunks if len(chunk)]
