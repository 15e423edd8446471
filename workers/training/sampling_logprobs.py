"""Where the ratio's denominator, pi_old, comes from (``algorithm.old_logprobs``).

rho_{j,t} = pi_theta(o_{j,t} | q, o_{j,<t}) / pi_old(o_{j,t} | q, o_{j,<t})      (Eq. 3, 9)

pi_old is the policy that sampled the responses: the trainer's weights before this step's
update (generation replicas are synced after every update, so the two are the same weights).

- ``recompute``: a no-grad forward pass over every own response under the pre-update
  weights, before routing (verl's ``old_log_prob``). Needed whenever the update takes more
  than one optimizer step (minibatches x epochs > 1): from the second minibatch on, theta
  has moved and pi_old must be the value from before the first step. Its per-response means
  are also the source side of the gate (Eq. 7).
- ``auto`` (default): when the update is ONE optimizer step over the whole batch
  (minibatches x epochs == 1), every forward of the update runs under pi_old's weights, so
  pi_old = sg(pi_theta) exactly and rho = 1 in value with the gradient of pi_theta (TRL does
  the same when ``num_iterations == 1``). The extra pass is skipped; the gate's source side
  is then the generation log-probs of the response (docs/algorithm.md section 2, step 5: exact for
  the ``hf`` backend, the sampler's for ``vllm``). Otherwise ``auto`` is ``recompute``.

Peer responses always need a pass under the receiver's pre-update weights: it is the
receiver side of the gate (Eq. 7), and those log-probs are the peer tokens' pi_old (Eq. 9).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MODES = ("auto", "recompute")


def recompute_needed(mode: str, minibatches: int, epochs: int) -> bool:
    """True when own responses need the pre-update forward pass (see the module docstring)."""
    if mode not in MODES:
        raise ValueError(f"algorithm.old_logprobs: expected one of {list(MODES)}, got {mode!r}")
    return mode == "recompute" or minibatches * epochs > 1


def generation_means(gen_logprobs: Sequence[Sequence[float]]) -> np.ndarray:
    """Per-response mean of the generation log-probs, l(pi_old^A, o^A | q) of Eq. 6 (NaN for
    an empty response, as the recompute path gives)."""
    return np.array([float(np.mean(lp)) if len(lp) else float("nan") for lp in gen_logprobs], dtype=float)
