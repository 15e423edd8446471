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
