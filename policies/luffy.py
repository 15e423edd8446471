"""``luffy``: GRAFT's group replacement with LUFFY's policy shaping on the peer tokens (Yan et al.,
arXiv 2504.14945; docs/algorithm.md, ``exchange.peer_ratio: shaped``): a peer token's ratio is
f(pi) = pi / (pi + gamma), gamma = ``exchange.shaping_gamma``, with no clip. It sets
``peer_ratio: shaped`` on every trainer rank; everything else is the ``graft`` transfer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.graft import GraftTransfer
from policies.transfer import register_transfer


@register_transfer("luffy")
@dataclass
class LuffyTransfer(GraftTransfer):
    def trainer_params(self) -> dict:
        return {"peer_ratio": "shaped"}
