"""Where the ratio's denominator, pi_old, comes from (``algorithm.old_logprobs``).

rho_{j,t} = pi_theta(o_{j,t} | q, o_{j,<t}) / pi_old(o_{j,t} | q, o_{j,<t})      (Eq. 3, 9)

pi_old is the policy that sampled the responses. In a synchronous run (``run.async: off``) that
is the trainer's weights before this step's update (generation replicas are synced after every
update, so the two are the same weights); with ``run.async: one_step`` the replicas sampled the
step's responses one update earlier, while the previous step trained.

- ``recompute``: a no-grad forward pass over every own response under the pre-update
  weights, before routing (verl's ``old_log_prob``). Needed in a synchronous run whenever the
  update takes more than one optimizer step (minibatches x epochs > 1): from the second
  minibatch on, theta has moved and pi_old must be the value from before the first step. Its
  per-response means are also the source side of the gate (Eq. 7).
- ``sampling``: the behaviour log-probs recorded at generation (the record's ``gen_logprobs``,
  exact for the ``hf`` backend, the sampler's for ``vllm``), so rho = pi_theta / pi_behaviour:
  the importance ratio of off-policy PPO, as verl's one-step-off and AReaL's decoupled loss use
  for the staleness of an overlapped rollout. ``run.async: one_step`` needs it (``auto`` becomes
  it there); in a synchronous run it skips the recompute pass at the price of the generation
  numerics (bf16 replicas, vLLM kernels) entering the ratio.
- ``auto`` (default): ``sampling`` under ``run.async: one_step``; in a synchronous run, when the
  update is ONE optimizer step over the whole batch (minibatches x epochs == 1), every forward of
  the update runs under pi_old's weights, so pi_old = sg(pi_theta) exactly and rho = 1 in value
  with the gradient of pi_theta (TRL does the same when ``num_iterations == 1``): no pass, no
  column; the gate's source side is the generation log-probs (docs/algorithm.md section 2,
  Eq. 7, its [choice]). Otherwise ``recompute``.

Peer responses always need a pass under the receiver's pre-update weights: it is the
receiver side of the gate (Eq. 7), and those log-probs are the peer tokens' pi_old (Eq. 9).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

Mode = Literal["auto", "recompute", "sampling"]
MODES: tuple[str, ...] = get_args(Mode)
Source = Literal["recompute", "sampling", "on_policy"]


def old_logp_source(mode: str, minibatches: int, epochs: int, overlapped: bool = False) -> Source:
    """Where own responses' pi_old comes from (see the module docstring): ``recompute`` (the
    trainer's pre-update pass), ``sampling`` (the behaviour log-probs) or ``on_policy``
    (sg(pi_theta) in the loss, no column). ``overlapped``: ``run.async: one_step``."""
    if mode not in MODES:
        raise ValueError(f"algorithm.old_logprobs: expected one of {list(MODES)}, got {mode!r}")
    if overlapped:
        if mode == "recompute":
            raise ValueError("algorithm.old_logprobs: recompute takes pi_old from the trainer's weights, but with "
                             "run.async: one_step the responses were sampled one update earlier; use auto or sampling")
        return "sampling"
    if mode == "auto":
        return "recompute" if minibatches * epochs > 1 else "on_policy"
    return mode  # type: ignore[return-value]


def recompute_needed(mode: str, minibatches: int, epochs: int, overlapped: bool = False) -> bool:
    """True when own responses need the pre-update forward pass."""
    return old_logp_source(mode, minibatches, epochs, overlapped) == "recompute"


def generation_means(gen_logprobs: Sequence[Sequence[float]]) -> np.ndarray:
    """Per-response mean of the generation log-probs, l(pi_old^A, o^A | q) of Eq. 6 (NaN for
    an empty response, as the recompute path gives)."""
    return np.array([float(np.mean(lp)) if len(lp) else float("nan") for lp in gen_logprobs], dtype=float)


def behaviour_logprobs(gen_logprobs: Sequence[Sequence[float]]) -> list[np.ndarray]:
    """The ``sampling`` pi_old: each response's generation log-probs as float32 token arrays (the
    dtype of the recompute path's)."""
    return [np.asarray(lp, dtype=np.float32) for lp in gen_logprobs]
