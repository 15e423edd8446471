"""``verify/failures``: answers the verifier could not judge are counted.

A math-verify child that does not start (on a head busy past ``startup_timeout_s``, or whose
math-verify does not import) gives every answer sent to it reward 0, reason "verifier
unavailable: ...", as a child that dies under an answer twice gives "verifier crashed". The step
metrics counted timeouts (``verify/timeouts``) but not these, so a run whose verifier was down
read as a model answering wrong: a lower reward and a higher all-fail rate (and the exchange
that follows from it), with nothing saying why (issue #51's forty-second read, half a)."""

from __future__ import annotations

from tests.test_response_cap import verify_metric
from workers.verify.math_verifier import MathVerifier
from workers.verify.plugin_verifier import plugin_reward
from workers.verify.verifier import is_unjudged


def test_answers_a_math_child_that_cannot_start_leaves_unjudged_are_counted():
    """A real math verifier whose child cannot be ready in time (a start-up limit far below a
    spawn's): its answers score 0 as "verifier unavailable", and ``verify/failures`` counts them,
    and neither wrong nor timed-out answers."""
    verifier = MathVerifier(timeout_s=2.0, startup_timeout_s=0.001, settle_integers=False)
    try:
        verdicts = verifier.verify_batch([(r"\boxed{\frac{1}{2}}", "0.5"), (r"\boxed{3}", "3")])
    finally:
        verifier.close()
    reasons = [v.reason for v in verdicts]
    assert [v.reward for v in verdicts] == [0.0, 0.0]
    assert all(r.startswith("verifier unavailable: ") for r in reasons), reasons
    assert verify_metric([*reasons, "wrong answer", "timeout after 5s", "correct"], "verify/failures") == 2.0
    assert is_unjudged("verifier crashed") and is_unjudged("reasoning_gym: verifier crashed")
    assert is_unjudged("plugin f failed: verifier unavailable: start-up failed: ImportError")
    assert not is_unjudged("unparsable: x") and not is_unjudged("timeout after 5s")


def _says_error(question: str, response: str, answer: str, metadata: dict) -> tuple[float, str]:
    """A reward plugin whose own reason for a malformed answer reads like a verifier's failure."""
    return 0.0, "error: no <answer> tag" if "<answer>" not in response else "timeout after 3 tries"


def test_a_plugin_s_own_reason_is_not_counted_as_the_verifier_s_failure():
    """A plugin that judged an answer wrong and said why in words a verifier's failure starts with
    (``error: ...``, ``timeout after ...``) left ``verify/failures`` and ``verify/timeouts`` at
    1 each: a run whose verifier was up read as one whose verifier was down (issue #51's
    forty-third read, half a). ``plugin_reward`` is what the plugin's child runs."""
    reasons = [plugin_reward(_says_error, "f", (response, "3"))[1] for response in ("3", "<answer>3")]
    assert verify_metric(reasons, "verify/failures") == 0.0
    assert verify_metric(reasons, "verify/timeouts") == 0.0
    assert all(reason.endswith(("no <answer> tag", "timeout after 3 tries")) for reason in reasons), reasons


def _says_failed(question: str, response: str, answer: str, metadata: dict) -> tuple[float, str]:
    """A reward plugin whose own reasons read like a plugin call's failure and a capped response."""
    return 0.0, "plugin check failed: no <answer> tag" if "<answer>" not in response else "too long (capped: 9 lines)"


def test_a_plugin_s_own_reason_is_not_counted_as_a_plugin_failure_or_a_cap():
    """A plugin that judged an answer wrong in words of a plugin call's failure (``plugin NAME
    failed: ...``) or of a capped response (``(capped: ...``) counted in ``train/plugin_failures``
    or ``verify/capped``: a working plugin read as raising, a response under ``max_chars`` as
    refused (issue #51's forty-fourth read, half a). ``plugin_reward`` is what the child runs."""
    reasons = [plugin_reward(_says_failed, "f", (response, "3"))[1] for response in ("3", "<answer>3")]
    assert verify_metric(reasons, "train/plugin_failures") == 0.0
    assert verify_metric(reasons, "verify/capped") == 0.0
    assert reasons[0].endswith("plugin check failed: no <answer> tag"), reasons


def _raises_capped(question: str, response: str, answer: str, metadata: dict) -> float:
    """A reward plugin whose exception's text holds ``(capped: ``."""
    raise ValueError("(capped: 9 lines)")


def test_a_plugin_s_exception_text_is_not_counted_as_a_cap():
    """A plugin raising with ``(capped: `` in its message counted in ``verify/capped`` as well as
    in ``train/plugin_failures``: a failure read as a response refused for ``max_chars``
    (issue #51's forty-fifth read, half a)."""
    reasons = [plugin_reward(_raises_capped, "f", ("3", "3"))[1]]
    assert verify_metric(reasons, "train/plugin_failures") == 1.0
    assert verify_metric(reasons, "verify/capped") == 0.0
