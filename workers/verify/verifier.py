"""Verifiable rewards: turn (response, gold answer) pairs into verdicts in [0, 1], safely.

The reward is the only signal RLVR trains on, and the responses are untrusted text from a
policy that is being optimised against this very code. So the layer is built around three
rules:

* ``verify`` never raises. Whatever the input (empty, megabytes, unbalanced braces, an
  expression that sends sympy into a 10^9-digit power), the answer is a ``Verdict`` with
  reward 0 and a reason, and the training step goes on.
* Every math-verify call has a hard time limit that works anywhere. math-verify's own
  timeouts are ``signal.alarm`` based, which only works in the main thread of the main
  interpreter: inside a Ray actor's executor thread it raises, and a watchdog thread cannot
  help either because sympy's big-integer arithmetic holds the GIL. So ``MathVerifier`` calls
  math-verify with its timeouts off (``parsing_timeout=None``, ``timeout_seconds=None``) in a
  persistent child process and SIGKILLs/restarts that process when one answer overruns.
* Only the final ``\\boxed{}`` answer is judged (see ``workers.verify.answer.extract_boxed``), and
  only in a response's last ``max_chars`` characters (``data.max_response_chars``), so cost is
  bounded per answer (:func:`cap_tail`).

Verifiers are picked by name from a small registry (``make_verifier("math")``) so configs can
name them: ``exact`` here, ``math`` in ``workers.verify.math_verifier`` (imported when first named),
``reasoning_gym`` (each reasoning-gym problem's own scorer) in ``workers.verify.rg_verifier``, and
reward-function plugins, ``python:package.module:function`` or ``python:/path/file.py:function``,
in ``workers.verify.plugin_verifier``. ``workers.verify.verifier_pool.VerifierPool`` spreads batches over Ray
actors. The built-in verifiers give 0 or 1; a plugin may give any reward in [0, 1].
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, runtime_checkable

from graftpool.contracts import SUCCESS_THRESHOLD
from graftpool.registry import Registry
from workers.verify.answer import extract_boxed, has_boxed, normalize_exact

if TYPE_CHECKING:
    pass

__all__ = [
    "SUCCESS_THRESHOLD",
    "ExactVerifier",
    "Query",
    "Verdict",
    "Verifier",
    "available_verifiers",
    "extract_boxed",
    "cap_tail",
    "is_capped",
    "is_plugin_failure",
    "is_timeout",
    "make_verifier",
    "register_verifier",
    "verify_many",
]

Pair = tuple[str, str]
"""(response, gold answer): what the built-in verifiers judge."""


class Query(NamedTuple):
    """A pair with the problem's question and metadata, for verifiers that take them (the
    plugins; ``takes_context = True``). Its first two fields are the pair, so every verifier
    reads ``item[0], item[1]``; ``VerifierPool`` sends only the pair to the others."""

    response: str
    answer: str
    question: str = ""
    metadata: Mapping[str, Any] | None = None


Item = Pair | Query


@dataclass(frozen=True)
class Verdict:
    """One judged answer: ``reward`` in [0, 1] (the built-in verifiers give 0.0 or 1.0, a
    plugin may give anything between), ``reason`` says why, for logs and debugging.

    Reasons in use: "correct", "wrong answer", "empty", "too long (capped: N chars > M)",
    "no \\boxed{} answer", "unbalanced \\boxed{", "empty \\boxed{}", "unparsable: ...",
    "unparsable gold answer: ...", "timeout after Xs" (X of the child's CPU time), "timeout after
    Ys wall clock" (the backstop, ``workers.verify.cpu_limit``), "verifier crashed",
    "verifier unavailable: ...", "error: ..."; a plugin's own, and
    "plugin NAME failed: ..." (``workers.verify.plugin_verifier``). A response judged on its
    last ``max_chars`` characters only has `` (capped: judged the last M of N chars)`` after
    its reason (:func:`cap_tail`, :func:`is_capped`).
    """

    reward: float
    reason: str

    def __post_init__(self) -> None:
        if not (isinstance(self.reward, int | float) and math.isfinite(self.reward) and 0.0 <= self.reward <= 1.0):
            raise ValueError(f"reward must be a number in [0, 1], got {self.reward!r}")

    @property
    def correct(self) -> bool:
        """A success: reward above :data:`SUCCESS_THRESHOLD` (1.0 for the built-in verifiers)."""
        return self.reward > SUCCESS_THRESHOLD


CORRECT = Verdict(1.0, "correct")
WRONG = Verdict(0.0, "wrong answer")


@runtime_checkable
class Verifier(Protocol):
    """Anything that judges one response against one gold answer, without raising.

    A verifier may also have ``settle(response, answer) -> Verdict | None``: the verdict
    when it is certain without the expensive path (else None). ``VerifierPool`` calls it in
    the driver, so settled answers never make a round trip to a verifier actor; it must give
    exactly the reward ``verify`` would."""

    def verify(self, response: str, answer: str) -> Verdict: ...


def verify_many(verifier: Verifier, pairs: Sequence[Item]) -> list[Verdict]:
    """``verifier.verify_batch(pairs)`` when it has one (batched, cheaper), else one by one.
    Items may be pairs or :class:`Query`; a verifier without ``takes_context`` reads the pair."""
    batch = getattr(verifier, "verify_batch", None)
    if callable(batch):
        return list(batch(list(pairs)))
    if getattr(verifier, "takes_context", False):
        return [verifier.verify(*item) for item in pairs]
    return [verifier.verify(item[0], item[1]) for item in pairs]


# ----------------------------------------------------------------------------- registry

VERIFIERS: Registry[Callable[..., Verifier]] = Registry(
    "verifier", "data.verifier",
    lazy={"math": "workers.verify.math_verifier", "python": "workers.verify.plugin_verifier",
          "reasoning_gym": "workers.verify.rg_verifier"},
    in_actors="the verifier actors")
register_verifier = VERIFIERS.register
"""Class decorator: make a verifier constructible as ``make_verifier(name, **params)``."""
available_verifiers = VERIFIERS.names

PLUGIN_PREFIX = "python:"
"""``data.verifier: python:<target>``: the ``python`` verifier (a reward-function plugin)."""

PLUGIN_FAILED = " failed: "
"""In a plugin failure's reason: ``plugin NAME failed: WHAT`` (``workers.verify.plugin_verifier``)."""


def is_plugin_failure(reason: str) -> bool:
    """Whether a verdict's reason is a reward plugin's failure (``train/plugin_failures``)."""
    return reason.startswith("plugin ") and PLUGIN_FAILED in reason


TIMEOUT = "timeout after "
"""How the reason of an answer its verifier's child ran out of time on starts, after the
verifier's prefix (``verify/timeouts``; ``workers.verify.cpu_limit``)."""


def _verifiers_own(reason: str) -> str:
    """A verdict's reason less the prefix it may carry: a plugin's ``plugin NAME failed: `` or a
    verifier's own ``NAME: `` (``reasoning_gym: ``)."""
    if is_plugin_failure(reason):
        return reason.partition(PLUGIN_FAILED)[2]
    head, colon, rest = reason.partition(": ")
    return rest if colon and head in available_verifiers() else reason


def is_timeout(reason: str) -> bool:
    """Whether a verdict's reason is a verifier child's timeout: :data:`TIMEOUT` at its start, or
    after a plugin's or a verifier's own prefix."""
    return _verifiers_own(reason).startswith(TIMEOUT)


UNJUDGED = ("verifier unavailable", "verifier crashed", "error: ")
"""How the reason of an answer its verifier could not judge starts, after the verifier's prefix
(``verify/failures``): its child did not start, died under it twice, or the judging raised."""


def is_unjudged(reason: str) -> bool:
    """Whether a verdict's reason says its verifier could not judge the answer (reward 0 for no
    fault of the answer): :data:`UNJUDGED` at its start, or after a verifier's own ``NAME: ``
    or a plugin's ``plugin NAME failed: `` (such a plugin answer also counts in ``train/plugin_failures``)."""
    return _verifiers_own(reason).startswith(UNJUDGED)


CAPPED = "(capped: "
"""In the reason of a response longer than the verifier's ``max_chars`` (``verify/capped``)."""


def is_capped(reason: str) -> bool:
    """Whether a verdict's reason is a response's over ``max_chars`` (judged on its tail, or,
    by a reward plugin, refused): ``verify/capped``."""
    return CAPPED in reason


def cap_tail(response: str, max_chars: int) -> tuple[str, str]:
    """``(text to judge, note for the reason)``: the response and "" when it has at most
    ``max_chars`` characters, else its last ``max_chars`` characters and
    `` (capped: judged the last M of N chars)``.

    The tail, not a refusal: a chain of thought puts its final ``\\boxed{}`` answer at the
    end, and ``extract_boxed`` judges the box that opens last. So whenever that box opens
    within the tail, the tail's verdict is the whole response's (the same opener, the same
    text after it); only a final box of more than ``max_chars`` characters is lost ("no
    \\boxed{} answer"). The parsers never see more than ``max_chars`` characters, which is
    what the cap is for (math-verify and sympy on pathological input)."""
    if len(response) <= max_chars:
        return response, ""
    return response[-max_chars:], f" {CAPPED}judged the last {max_chars} of {len(response)} chars)"


def noted(verdict: Verdict, note: str) -> Verdict:
    """``verdict`` with ``note`` (:func:`cap_tail`'s) after its reason."""
    return Verdict(verdict.reward, verdict.reason + note) if note else verdict


def make_verifier(name: str, **params: Any) -> Verifier:
    """Build the verifier registered as ``name`` with ``params``; ``python:<target>`` builds
    the plugin verifier for that target. Unknown names are a config error and raise
    ValueError (the only place in this module that raises on purpose)."""
    if name.startswith(PLUGIN_PREFIX):
        return VERIFIERS.get("python")(target=name[len(PLUGIN_PREFIX):], **params)
    return VERIFIERS.get(name)(**params)


# ----------------------------------------------------------------------------- shared checks


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _precheck(response: object, max_chars: int) -> tuple[Verdict | str, str]:
    """The cheap, parser-free gate every boxed-answer verifier runs first: returns the boxed
    content to judge, or the 0-reward Verdict that settles the response already; and the
    :func:`cap_tail` note the final verdict's reason gets (the Verdict here has it already).
    The cap comes before extraction, so that a runaway generation costs one slice."""
    if not isinstance(response, str):
        return Verdict(0.0, f"error: response is {type(response).__name__}, not str"), ""
    text, note = cap_tail(response, max_chars)
    if not text.strip():
        return Verdict(0.0, "empty" + note), note
    content = extract_boxed(text)
    if content is None:
        reason = "unbalanced \\boxed{" if has_boxed(text) else "no \\boxed{} answer"
        return Verdict(0.0, reason + note), note
    if not content:
        return Verdict(0.0, "empty \\boxed{}" + note), note
    return content, note


def _check_limits(timeout_s: float | None, max_chars: int) -> None:
    if timeout_s is not None and not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")


# ----------------------------------------------------------------------------- exact


@register_verifier("exact")
class ExactVerifier:
    """String equality of the boxed content and the gold answer after ``normalize_exact``
    (whitespace removed, surrounding ``$`` dropped, ``12.0`` -> ``12``).

    For datasets whose answers are labels or canonical strings (multiple choice letters,
    integers). Linear-time string work only, so it needs no worker process; ``timeout_s`` is
    accepted so that every verifier takes the same parameters, and ignored. A response over
    ``max_chars`` (a run passes ``data.max_response_chars``) is judged on its tail
    (:func:`cap_tail`).
    """

    def __init__(self, max_chars: int = 10_000, timeout_s: float | None = None) -> None:
        _check_limits(timeout_s, max_chars)
        self.max_chars = max_chars

    def verify(self, response: str, answer: str) -> Verdict:
        try:
            checked, note = _precheck(response, self.max_chars)
            if isinstance(checked, Verdict):
                return checked
            return noted(CORRECT if normalize_exact(checked) == normalize_exact(str(answer)) else WRONG, note)
        except Exception as exc:  # the contract is "never raises"
            return Verdict(0.0, f"error: {type(exc).__name__}: {_clip(str(exc))}")

    def verify_batch(self, pairs: Sequence[Item]) -> list[Verdict]:
        return [self.verify(item[0], item[1]) for item in pairs]

    def settle(self, response: str, answer: str) -> Verdict:
        """Exact match is cheap string work: it always settles where it is called."""
        return self.verify(response, answer)
