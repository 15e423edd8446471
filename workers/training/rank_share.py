"""Which rows a data-parallel rank scores (issue #54): scoring is split over the ranks, each
taking one contiguous slice, and the driver concatenates their answers in rank order.

    per = ceil(count / world_size);  rank r: rows [r * per, min((r + 1) * per, count))

Contiguous slices keep a prompt's samples together, so they still share the prompt's forward
(``workers.training.logprobs.row_logprobs``).
"""

from __future__ import annotations


def rank_share(count: int, rank: int, world_size: int) -> slice:
    """Rank ``rank``'s slice of ``count`` rows (empty where the rows run out before it)."""
    per = -(-count // max(world_size, 1))
    return slice(min(rank * per, count), min((rank + 1) * per, count))
