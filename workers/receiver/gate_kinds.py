"""What the gate scores a donor response on: ``exchange.gate_kind``, a registry of one function
each (issue #53; docs/algorithm.md, "exchange.gate_kind"). Every kind gives the s that Eq. 8,
w = 1[s > delta] * min(s, 1), then gates on; ``token_mean`` is the paper's Eq. 7.

Notation, for one donor response o offered by A to the receiver B: l_B and l_A the mean token
log-likelihoods of Eq. 6 (B's pre-update weights on its re-tokenisation o^B, A's on its own
tokens o^A: the record's ``mean_logp``), n_B = |o^B| and n_A = |o^A| (the end token, a turn end
or EOS, included where the response ended), L = n * l the total log-likelihoods, bytes(o) the UTF-8 length of the response
text. ``benchmarks/gate_auroc.py`` computes the same scores offline from a run's store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from graftpool.contracts import OWN
from graftpool.registry import Registry
from graftpool.step_record import StepRecord
from workers.verify.answer import last_boxed_start


def compatibility_scores(receiver_mean_logp: ArrayLike, source_mean_logp: ArrayLike) -> np.ndarray:
    """Eq. 7: s(o|q) = exp( l(pi_old^B, o^B | q) - l(pi_old^A, o^A | q) ).

    l is the mean token log-likelihood (Eq. 6): the receiver's pre-update weights on its
    own re-tokenisation o^B, and the source's log-probs on its own tokens o^A.
    """
    diff = np.asarray(receiver_mean_logp, dtype=float) - np.asarray(source_mean_logp, dtype=float)
    return np.exp(diff)


@dataclass(frozen=True)
class GateInputs:
    """One donor group as the gate kinds read it, each array [n] (one per donor response);
    a kind reads only its own fields, and :func:`gate_inputs` fills what the kind needs."""

    receiver_mean: np.ndarray  # l_B (-inf: the response re-tokenised to nothing)
    donor_mean: np.ndarray  # l_A (NaN: unknown)
    receiver_tokens: np.ndarray | None = None  # n_B
    donor_tokens: np.ndarray | None = None  # n_A
    text_bytes: np.ndarray | None = None  # bytes(o)
    receiver_reasoning_mean: np.ndarray | None = None  # B's mean over o^B before the final \boxed{ (NaN: none)
    donor_reasoning_mean: np.ndarray | None = None  # A's mean over o^A before the final \boxed{ (NaN: none)
    receiver_own_means: np.ndarray | None = None  # [n'] l_B of B's own responses to the prompt (finite ones)


@dataclass(frozen=True)
class GateKind:
    """A gate kind's score, and whether it needs the answer spans (a pass over the tokens)."""

    score: Callable[[GateInputs], np.ndarray]
    answer_spans: bool = False
    needs_donor_tokens: bool = False  # a stored donor has no tokens: refused at load (policies.stored)


GATE_KINDS: Registry[GateKind] = Registry("gate kind", "exchange.gate_kind", in_actors="the trainer ranks")


def register_gate_kind(name: str, answer_spans: bool = False, needs_donor_tokens: bool = False):
    """Register a score function (GateInputs -> s [n]) as the gate kind ``name``."""

    def wrap(fn: Callable[[GateInputs], np.ndarray]) -> Callable[[GateInputs], np.ndarray]:
        # the entry is a GateKind instance: judged by the module of the function it wraps
        GATE_KINDS.register(name, module=fn.__module__)(GateKind(fn, answer_spans, needs_donor_tokens))
        return fn

    return wrap


@register_gate_kind("token_mean")
def token_mean(g: GateInputs) -> np.ndarray:
    """The paper (Eq. 7): s = exp(l_B - l_A)."""
    return compatibility_scores(g.receiver_mean, g.donor_mean)


@register_gate_kind("per_byte", needs_donor_tokens=True)
def per_byte(g: GateInputs) -> np.ndarray:
    """Tokenizer-invariant: s = exp((L_B - L_A) / bytes(o)), L_B = n_B l_B, L_A = n_A l_A: the
    log-likelihood ratio of the whole response per byte of its text (NaN for an empty text)."""
    size = np.asarray(g.text_bytes, dtype=float)
    total_b = np.asarray(g.receiver_tokens, dtype=float) * np.asarray(g.receiver_mean, dtype=float)
    total_a = np.asarray(g.donor_tokens, dtype=float) * np.asarray(g.donor_mean, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(size > 0, np.exp((total_b - total_a) / np.where(size > 0, size, 1.0)), np.nan)


@register_gate_kind("answer_masked", answer_spans=True, needs_donor_tokens=True)
def answer_masked(g: GateInputs) -> np.ndarray:
    """The reasoning only: s = exp(r_B - r_A), r the mean token log-likelihood over the tokens
    before the final ``\\boxed{`` (the answer span, its closing and the EOS left out; all tokens
    where the text has no ``\\boxed{``), on B's re-tokenisation and A's own tokens; NaN where
    either side has no token before it."""
    return compatibility_scores(g.receiver_reasoning_mean, g.donor_reasoning_mean)


@register_gate_kind("self_calibrated")
def self_calibrated(g: GateInputs) -> np.ndarray:
    """Against the receiver itself, no term of the donor's model: s = exp(l_B - mean_j l_B(o_j)),
    the mean over B's own n responses o_j to the same prompt (their ``mean_logp``, finite ones;
    NaN where there are none)."""
    own = np.asarray(g.receiver_own_means, dtype=float)
    baseline = own.mean() if own.size else np.nan
    return np.exp(np.asarray(g.receiver_mean, dtype=float) - baseline)


def answer_start(tokenizer, ids: Sequence[int], text: str, skip_special_tokens: bool = False) -> int:
    """How many of ``ids`` come before the final ``\\boxed{`` of ``text`` (their decoded text ends
    at or before it): the largest k with len(decode(ids[:k])) <= its position, by bisection;
    len(ids) where the text has none. ``text`` must be ``ids`` decoded as the prefixes are:
    ``skip_special_tokens`` True for a model's own response, whose text its replica decoded without
    special tokens (a special token the model wrote before its answer, ``<|im_start|>``, would
    otherwise count its name's characters and move the start tokens early); False for a
    re-tokenisation, the literal text with the receiver's end appended."""
    at = last_boxed_start(text)
    if at < 0:
        return len(ids)
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        prefix = tokenizer.decode(list(ids[:mid]), skip_special_tokens=skip_special_tokens,
                                  clean_up_tokenization_spaces=False)
        lo, hi = (mid, hi) if len(prefix) <= at else (lo, mid - 1)
    return lo


def reasoning_mean(logp, start: int | None) -> float:
    """The mean of a response's per-token log-probs before ``start`` (NaN: none, or no start)."""
    if start is None or start <= 0 or logp is None:
        return float("nan")
    part = logp[:start]
    return float(np.mean(np.asarray(part.tolist() if hasattr(part, "tolist") else list(part), dtype=float)))


def donor_logp(step: StepRecord, r: int):
    """The donor's per-token log-probs of row ``r`` (a_t of l_A): the record's ``old_logp``, else
    its behaviour log-probs ``gen_logprobs``."""
    return step["old_logp"][r] if "old_logp" in step and step["old_logp"][r] is not None else step["gen_logprobs"][r]


def gate_inputs(kind: str, tokenizer, step: StepRecord, group: list[int], old: Sequence,
                response_ids: Sequence[Sequence[int]]) -> GateInputs:
    """A receiver's :class:`GateInputs` for one donor group (rows ``group`` of its ``step``),
    given its pi_old per token ``old`` on its re-tokenisations ``response_ids``. The donor's
    answer span is the record's ``answer_start`` (``orchestrator.controller.exchange``), its
    per-token log-probs the record's ``old_logp``, else its behaviour log-probs."""
    receiver_mean = np.array([float(lp.mean()) if len(lp) else -np.inf for lp in old])
    donor_mean = np.array([np.nan if step["mean_logp"][r] is None else step["mean_logp"][r] for r in group],
                          dtype=float)
    own = [step["mean_logp"][r] for r in step.where(kind=OWN, prompt_id=step["prompt_id"][group[0]])]
    fields = dict(
        receiver_tokens=np.array([len(ids) for ids in response_ids], dtype=float),
        donor_tokens=np.array([len(step["token_ids"][r] or ()) for r in group], dtype=float),
        text_bytes=np.array([len((step["response"][r] or "").encode("utf-8")) for r in group], dtype=float),
        receiver_own_means=np.array([m for m in own if m is not None and np.isfinite(m)], dtype=float))
    if GATE_KINDS.get(kind).answer_spans:
        source = [donor_logp(step, r) for r in group]
        fields["receiver_reasoning_mean"] = np.array([
            reasoning_mean(lp, answer_start(tokenizer, ids, step["response"][r]))
            for r, lp, ids in zip(group, old, response_ids, strict=True)])
        starts = step.get("answer_start")
        fields["donor_reasoning_mean"] = np.array([reasoning_mean(lp, starts[r])
                                                   for r, lp in zip(group, source, strict=True)])
    return GateInputs(receiver_mean, donor_mean, **fields)
