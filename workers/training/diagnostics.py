"""What a receiver's step did with peer data, as metrics (issue #28): the net push of the admitted
peer rows and how each optimizer update was made up.

- ``exchange/peer_push`` = sum_j w_j a_j over the admitted peer rows (grafted or added; SGT items
  carry no advantage; w_j as trained: a HACPO peer's is known after its update, 0 outside
  [lb_m, 1]), ``exchange/peer_push_abs`` = sum_j w_j |a_j|, and their ratio. A donor
  group's advantages sum to zero (Eq. 1), so a negative push means the gate admitted more of its
  wrong answers' weight than of its right ones': the step pushes the receiver's likelihood of
  the peer's solutions down more than up.
- per update i of the step: ``train/update_<i>/kind`` (0 own rows only, 1 own and peer, 2 peer
  only), ``/rows``, ``/tokens``, ``/grad_norm``; the counts ``train/updates_own`` /
  ``_mixed`` / ``_peer``; and ``train/peer_grad_share`` = sum_i |g_i^peer| / sum_i (|g_i^own| +
  |g_i^peer|), the share of the step's gradient norm that came from peer rows (NaN where the
  backend keeps its gradient out of reach, or ``models[].trainer.grad_parts`` is off).

The own / peer parts of a mixed update's gradient g (summed over ranks, before clipping) are read
on the device (:func:`grad_parts`): o, the gradient after the own rows alone (a per-parameter
snapshot on the device), |g^own| = sqrt(sum_p |o_p|^2) and |g^peer| = |g - o| =
sqrt(sum_p |g_p - o_p|^2), accumulated over parameters on the device; two floats come back to
the host per update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from graftpool.step_record import StepRecord

UPDATE_KINDS = {"own": 0.0, "mixed": 1.0, "peer": 2.0}


class UpdateLike(Protocol):
    kind: str
    rows: int
    tokens: int
    grad_norm: float
    own_grad_norm: float
    peer_grad_norm: float


def grad_parts(own: list[torch.Tensor | None], total: list[torch.Tensor | None]) -> list[float]:
    """[|g^own|, |g^peer|] (module docstring) from the own snapshot and the total gradient, one
    tensor per parameter in the same order (None: no gradient, read as zero); differences in fp32,
    squared sums in fp64, on the tensors' device; only the two norms are read back."""
    if len(own) != len(total):
        raise ValueError(f"grad_parts: {len(own)} own tensors for {len(total)} gradients")
    squares = None
    for o, g in zip(own, total, strict=True):
        if o is None and g is None:
            continue
        o32 = o.float() if o is not None else torch.zeros_like(g, dtype=torch.float32)
        g32 = g.float() if g is not None else torch.zeros_like(o32)
        pair = torch.stack([o32.square().sum(dtype=torch.float64), (g32 - o32).square().sum(dtype=torch.float64)])
        squares = pair if squares is None else squares + pair
    if squares is None:
        return [0.0, 0.0]
    return squares.sqrt().tolist()


def peer_push(rows: StepRecord, policy_term: str) -> dict[str, float]:
    """The net push of the admitted peer rows and its magnitude (module docstring); ``rows``: the
    trained rows' columns (``peer``, ``term``, ``weight``, ``trained_advantage``), the peer rows of
    the policy-gradient term (``policy_term``) counted."""
    peer = [(w, a) for w, a, is_peer, term in zip(rows["weight"], rows["trained_advantage"], rows["peer"],
                                                   rows["term"], strict=True) if is_peer and term == policy_term]
    push = float(sum(w * a for w, a in peer))
    magnitude = float(sum(w * abs(a) for w, a in peer))
    return {"exchange/peer_push": push, "exchange/peer_push_abs": magnitude,
            "exchange/peer_push_ratio": push / magnitude if magnitude else float("nan")}


def update_metrics(updates: Sequence[UpdateLike]) -> dict[str, float]:
    """Per-update kind, rows, tokens and gradient norm; counts by kind; the peer share of the
    gradient (module docstring)."""
    out: dict[str, float] = {f"train/updates_{kind}": float(sum(u.kind == kind for u in updates))
                             for kind in UPDATE_KINDS}
    for i, u in enumerate(updates):
        out |= {f"train/update_{i}/kind": UPDATE_KINDS[u.kind], f"train/update_{i}/rows": float(u.rows),
                f"train/update_{i}/tokens": float(u.tokens), f"train/update_{i}/grad_norm": float(u.grad_norm)}
    own = np.array([u.own_grad_norm for u in updates], dtype=float)
    peer = np.array([u.peer_grad_norm for u in updates], dtype=float)
    known = np.isfinite(own) & np.isfinite(peer)
    total = float((own[known] + peer[known]).sum())
    out["train/peer_grad_share"] = float(peer[known].sum()) / total if known.all() and total > 0 else float("nan")
    return out
