"""Which donor groups may serve which receivers (Eq. 4), read by the exchange policies and by the
controller (which scores the eligible pairs for ``most_compatible``): below both, so that neither
imports the other."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def eligibility(
    k: np.ndarray,
    n: int,
    receivers: Sequence[int] | None = None,
    donors: Sequence[int] | None = None,
    usable: np.ndarray | None = None,
) -> np.ndarray:
    """E[d, m, q] = k_m(q) = 0 and d's group on q usable, for donor d and receiver m in the sets;
    ``usable`` ([M, P] bool) defaults to Eq. 4's 1 <= k_d(q) < n."""
    num_models = k.shape[0]
    mixed = (k >= 1) & (k < n) if usable is None else np.asarray(usable, dtype=bool)
    all_fail = k == 0
    eligible = mixed[:, None, :] & all_fail[None, :, :]
    if receivers is not None:
        eligible &= np.isin(np.arange(num_models), receivers)[None, :, None]
    if donors is not None:
        eligible &= np.isin(np.arange(num_models), donors)[:, None, None]
    return eligible
