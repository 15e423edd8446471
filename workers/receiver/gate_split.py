"""The gate's ln s split into the answer span, the rest and EOS (issue #53, part 2).

For one donor response o offered by A to B, with b_t B's pre-update log-probs of its
re-tokenisation o^B (n_B tokens) and a_t A's of its own tokens o^A (n_A tokens), Eq. 7's

    ln s = (1/n_B) sum_t b_t - (1/n_A) sum_t a_t

splits, on each side, into three sums over disjoint token sets, each divided by that side's n:

    part_answer = (1/n_B) sum_{t in ans_B} b_t  - (1/n_A) sum_{t in ans_A} a_t
    part_rest   = (1/n_B) sum_{t in rest_B} b_t - (1/n_A) sum_{t in rest_A} a_t
    part_eos    = b_eos / n_B                   - a_eos / n_A

so part_answer + part_rest + part_eos = ln s. ans: the tokens from the final ``\\boxed{`` on
(``gate_kinds.answer_start``), EOS excluded; rest: the tokens before it (the reasoning; every
token where the text has no ``\\boxed{``); eos: the token that ends a finished response (its EOS or its chat template's turn end; on o^B the
receiver's own, ``retokenize.response_end_id``).
**[choice]** A response cut at the budget (``finished`` false) has no EOS on either side: its
part_eos is NaN and part_answer + part_rest = ln s. All three are NaN where a side has no
per-token log-probs or no token (a response that re-tokenised to nothing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

SPLIT_COLUMNS = ("compat_answer", "compat_rest", "compat_eos")
"""The store's columns of :class:`LogSSplit`, in its field order (graft rows; null elsewhere, and
for a part that is NaN)."""


class LogSSplit(NamedTuple):
    """One side's (or the difference's) three parts of a mean token log-likelihood."""

    answer: float
    rest: float
    eos: float


def side_parts(logp, start: int | None, finished: bool) -> LogSSplit | None:
    """One side's parts of its mean log-likelihood l = (1/n) sum_t x_t: (1/n) sum over the answer
    span [start, n_body), (1/n) sum over [0, start), and x_eos / n (NaN when not ``finished``);
    n_body = n - 1 when the last token is the EOS of a finished response, else n. ``start``
    (None: the text's answer span is unknown) is clamped to [0, n_body]. None: no log-probs,
    no token, or no start."""
    if logp is None or start is None:
        return None
    x = np.asarray(logp, dtype=float)  # a tensor, an array or a list
    n = len(x)
    if n == 0:
        return None
    body = n - 1 if finished else n
    k = min(max(int(start), 0), body)
    eos = x[-1] / n if finished else math.nan
    return LogSSplit(float(x[k:body].sum() / n), float(x[:k].sum() / n), float(eos))


def split_log_s(receiver_logp, receiver_start: int | None, donor_logp, donor_start: int | None,
                finished: bool) -> LogSSplit:
    """ln s split into (answer, rest, eos): B's :func:`side_parts` minus A's (NaN where
    either side has none)."""
    b = side_parts(receiver_logp, receiver_start, finished)
    a = side_parts(donor_logp, donor_start, finished)
    if a is None or b is None:
        return LogSSplit(math.nan, math.nan, math.nan)
    return LogSSplit(b.answer - a.answer, b.rest - a.rest, b.eos - a.eos)


def split_sum(parts: Sequence[float]) -> float:
    """part_answer + part_rest + part_eos, a cut response's NaN (or, as stored, null) part_eos counted as 0: ln s."""
    answer, rest, eos = parts
    return answer + rest + (0.0 if eos is None or math.isnan(eos) else eos)
