"""The verifier layer: boxed-answer extraction, the exact and math verifiers, the hard
timeout around math-verify (its child process's deaths: ``tests/test_math_child.py``), and the
Ray actor pool. Real math-verify, real processes, real Ray; no mocks."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.math_answers import HANG, TIMEOUT_S  # an answer whose comparison never ends
from workers.verify.answer import e_notation_as_latex, extract_boxed, has_boxed, normalize_exact
from workers.verify.math_verifier import MathVerifier, _math_compare
from workers.verify.verifier import (
    ExactVerifier,
    Verdict,
    Verifier,
    available_verifiers,
    is_capped,
    make_verifier,
    verify_many,
)
from workers.verify.verifier_pool import VerifierPool

# ----------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{12}.", "12"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\boxed{ {a}{ {b} } }", "{a}{ {b} }"),
        (r"first \boxed{1}, finally \boxed{2}", "2"),
        (r"\boxed{\boxed{3}}", "3"),  # innermost opener is the last one
        (r"\boxed {7}", "7"),
        (r"\boxed{\{1,2\}}", r"\{1,2\}"),  # escaped braces are literal, not grouping
        (r"\boxed{\left\{ x \right.}", r"\left\{ x \right."),
        (r"\boxed{}", ""),
        ("no box here", None),
        (r"\boxed{1", None),
        (r"\boxed{1} then \boxed{2", None),  # a truncated last box is not replaced by a draft
        (r"\boxed{\}", None),
        ("", None),
    ],
)
def test_extract_boxed_cases(text, expected):
    assert extract_boxed(text) == expected


def test_has_boxed_tells_unbalanced_from_missing():
    assert has_boxed(r"\boxed{1") and not has_boxed("1")


def test_extract_boxed_megabyte_and_deep_inputs():
    depth = 500_000
    deep = r"\boxed{" + "{" * depth + "x" + "}" * depth + "}"
    assert extract_boxed(deep) == "{" * depth + "x" + "}" * depth
    assert extract_boxed(r"\boxed{" + "{" * 1_000_000) is None
    assert extract_boxed(r"\boxed{" * 200_000) is None
    assert extract_boxed(r"\boxed{1}" * 100_000) == "1"
    assert extract_boxed("\\" * 1_000_001 + "}") is None


_BALANCED = st.recursive(
    st.text(alphabet="ab1+^ ", max_size=5),
    lambda inner: st.lists(inner, max_size=3).map(lambda xs: "{" + "".join(xs) + "}"),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(
    prefix=st.text(max_size=30),
    content=st.lists(_BALANCED, max_size=4).map("".join),
    suffix=st.text(alphabet=st.characters(blacklist_characters="\\"), max_size=30),
)
def test_extract_boxed_finds_balanced_content(prefix, content, suffix):
    # Whatever comes before, a balanced final box followed by box-free text is what counts.
    text = prefix + r" \boxed{" + content + "}" + suffix
    assert extract_boxed(text) == content.strip()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4.5e33", r"4.5 \times 10^{33}"),
        ("1.6E-19", r"1.6 \times 10^{-19}"),
        (".5e+3 J", r".5 \times 10^{+3} J"),
        (r"x = 2e3, \text{so} 7", r"x = 2 \times 10^{3}, \text{so} 7"),
        ("e^{2} + 2e", "e^{2} + 2e"),  # Euler's e stays
        ("x2e3", "x2e3"),  # inside a word
        ("2e3x", "2e3x"),
        ("1.2.3e4", "1.2.3e4"),
        (r"\frac{1}{2}", r"\frac{1}{2}"),
    ],
)
def test_e_notation_as_latex(text, expected):
    assert e_notation_as_latex(text) == expected


def test_normalize_exact():
    assert normalize_exact(" x + 1 ") == "x+1"
    assert normalize_exact("$12$") == "12"
    assert normalize_exact("12.00") == normalize_exact("12") == "12"
    assert normalize_exact("-3.0") == "-3"
    assert normalize_exact("12.5") == "12.5"
    assert normalize_exact("A") != normalize_exact("a")


# ----------------------------------------------------------------------------- registry


def test_registry_and_protocol():
    assert set(available_verifiers()) >= {"math", "exact"}
    exact = make_verifier("exact")
    assert isinstance(exact, ExactVerifier) and isinstance(exact, Verifier)
    assert isinstance(make_verifier("math", timeout_s=1.0), MathVerifier)
    with pytest.raises(ValueError, match=r"data.verifier: unknown verifier .sympy.; expected one of \[.exact., .math."):
        make_verifier("sympy")


def test_verdict_is_in_the_unit_interval_and_frozen():
    assert Verdict(1.0, "correct").correct
    assert not Verdict(0.5, "partial").correct  # a plugin's fractional reward; success: > 0.5
    for bad in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError):
            Verdict(bad, "x")
    with pytest.raises(AttributeError):
        Verdict(0.0, "x").reward = 1.0  # type: ignore[misc]


# ----------------------------------------------------------------------------- exact


def test_exact_verifier():
    v = ExactVerifier(max_chars=100)
    assert v.verify(r"thus \boxed{12}", "12").reason == "correct"
    assert v.verify(r"\boxed{ 12.0 }", "12").reward == 1.0
    assert v.verify(r"\boxed{B}", "B").reward == 1.0
    assert v.verify(r"\boxed{\frac{1}{2}}", "0.5") == Verdict(0.0, "wrong answer")
    assert v.verify("12", "12") == Verdict(0.0, "no \\boxed{} answer")
    assert v.verify(r"\boxed{12", "12") == Verdict(0.0, "unbalanced \\boxed{")
    assert v.verify("  ", "12") == Verdict(0.0, "empty")
    assert v.verify("x" * 101, "12") == Verdict(0.0, "no \\boxed{} answer (capped: judged the last 100 of 101 chars)")
    assert [x.reward for x in verify_many(v, [(r"\boxed{1}", "1"), (r"\boxed{2}", "1")])] == [1, 0]


# ----------------------------------------------------------------------------- math


@pytest.mark.parametrize(
    ("response", "answer", "reward"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
        (r"The answer is \boxed{12}.", "12", 1.0),
        (r"\boxed{12}", r"$12$", 1.0),
        (r"\boxed{\dfrac{\sqrt{3}}{2}}", r"\frac{\sqrt 3}{2}", 1.0),
        (r"\boxed{x+1}", "1+x", 1.0),
        (r"\boxed{\{2, 1\}}", r"\{1,2\}", 1.0),
        (r"draft \boxed{7} ... so \boxed{1/2}", r"\frac12", 1.0),
        (r"\boxed{13}", "12", 0.0),
        (r"\boxed{0.49}", "0.5", 0.0),
        (r"\boxed{\sqrt{2}}", "2", 0.0),
        # e-notation golds (MinervaMath's) are numbers, not products with Euler's e
        (r"\boxed{4.5 \times 10^{33}}", "4.5e33", 1.0),
        (r"\boxed{1.6 \times 10^{-19}}", "1.6e-19", 1.0),
        (r"\boxed{1.6e-19}", r"1.6 \times 10^{-19}", 1.0),
        (r"\boxed{4.397}", "6.4e-13", 0.0),
    ],
)
def test_math_equivalences(math_verifier, response, answer, reward):
    verdict = math_verifier.verify(response, answer)
    assert verdict.reward == reward
    assert verdict.reason == ("correct" if reward else "wrong answer")


def test_math_rejects_before_parsing(math_verifier):
    assert math_verifier.verify("", "1") == Verdict(0.0, "empty")
    # over max_chars only the tail is read (workers.verify.verifier.cap_tail), and so parsed
    assert math_verifier.verify(r"\boxed{1}" + " " * 20_000, "1") == Verdict(
        0.0, "empty (capped: judged the last 10000 of 20009 chars)"
    )
    assert math_verifier.verify("x" * 5_000_000, "1").reason == \
        "no \\boxed{} answer (capped: judged the last 10000 of 5000000 chars)"
    assert math_verifier.verify("1", "1").reason == "no \\boxed{} answer"
    assert math_verifier.verify(r"\boxed{\frac{1}{2}", "0.5").reason == "unbalanced \\boxed{"
    assert math_verifier.verify(r"\boxed{ }", "1").reason == "empty \\boxed{}"
    assert math_verifier.verify(None, "1").reward == 0.0  # type: ignore[arg-type]


def test_math_unparsable(math_verifier):
    # math-verify falls back to the raw string for most text sympy cannot read (and then
    # compares strings), so "unparsable" means it extracted nothing at all.
    assert math_verifier.verify(r"\boxed{\text{}}", "1") == Verdict(0.0, "unparsable: \\text{}")
    assert math_verifier.verify(r"\boxed{1}", "$").reason == "unparsable gold answer: $"


_PIECES = st.sampled_from(
    ["\\boxed{", "\\boxed {", "{", "}", "\\", "\\{", "\\frac{", "^{", "1", "x", "=", " ", "$"]
)


@settings(max_examples=50, deadline=None)
@given(
    response=st.lists(st.one_of(st.text(max_size=8), _PIECES), max_size=16).map("".join),
    answer=st.one_of(st.text(max_size=6), st.sampled_from(["1", "x", r"\frac12", "}{"])),
)
def test_fuzz_every_call_returns_a_binary_verdict(math_verifier, response, answer):
    for verdict in [
        math_verifier.verify(response, answer),
        ExactVerifier().verify(response, answer),
    ]:
        assert isinstance(verdict, Verdict)
        assert verdict.reward in (0.0, 1.0)
        assert verdict.reason


def _tower(base: int, height: int) -> str:
    return "^{".join([str(base)] * height) + "}" * (height - 1)


# Hostile answers: power towers sympy would spend forever on, deeply nested \frac, megabyte
# strings, unbalanced and piled-up \boxed{, and random unicode, boxed or not.
_HOSTILE = st.one_of(
    st.tuples(st.integers(2, 99), st.integers(2, 5)).map(lambda t: r"\boxed{" + _tower(*t) + "}"),
    st.integers(1, 2_000).map(lambda d: r"\boxed{" + r"\frac{1}{" * d + "2" + "}" * d + "}"),
    st.integers(1, 4_000).map(lambda d: r"\boxed{" + "{" * d + "1" + "}" * d + "}"),
    st.tuples(st.integers(1_000_000, 3_000_000), st.sampled_from(["x", r"\boxed{1}", "{", "\u00e9"])).map(
        lambda t: t[1] * (t[0] // len(t[1]))),
    st.integers(1, 5_000).map(lambda n: r"\boxed{" * n),
    st.text(max_size=300),
    st.text(max_size=60).map(lambda t: r"\boxed{" + t + "}"),
    st.sampled_from([r"\boxed{10^{10^{10^{10}}}}", r"\boxed{9!!!!!!}", r"\boxed{(10^{100})!}",
                     r"\boxed{e^{e^{e^{e^{100}}}}}", r"\boxed{1e999999999}", r"\boxed{2^{-2^{100}}}"]),
)


@settings(max_examples=40, deadline=None)
@given(response=_HOSTILE, answer=st.one_of(st.sampled_from(["1", "2", r"\frac12", "10^{10}"]), st.text(max_size=20)))
def test_fuzz_hostile_inputs_get_a_binary_verdict_within_the_timeout(math_verifier, response, answer):
    # the judging time is bounded by the timeout; a child killed for overrunning is replaced,
    # and that start-up (0.5-1 s, more on a loaded machine) is the only other cost
    start = time.monotonic()
    verdict = math_verifier.verify(response, answer)
    elapsed = time.monotonic() - start
    assert verdict.reward in (0.0, 1.0) and verdict.reason
    assert elapsed < TIMEOUT_S + 15.0, (verdict, elapsed)
    if len(response) > math_verifier.max_chars:
        assert is_capped(verdict.reason)


# ----------------------------------------------------------------------------- fast path

_INTEGER = st.from_regex(r"[+-]?[0-9]{1,15}", fullmatch=True)


@settings(max_examples=300, deadline=None)
@given(content=_INTEGER, gold=_INTEGER, near=st.booleans(), delta=st.integers(-11, 11))
def test_fast_path_gives_math_verify_s_reward_on_integers(content, gold, near, delta):
    """settle() decides integer answers without math-verify, and exactly as math-verify does
    (_math_compare is what the child process runs), near misses and zero padding included."""
    if near:  # answers one digit or sign off the gold are the interesting ones
        content = str(int(gold) + delta)
    verifier = MathVerifier()
    settled = verifier.settle(rf"so \boxed{{{content}}}", gold)
    assert settled is not None
    assert (settled.reward, settled.reason) == _math_compare(content, gold, {})


def test_fast_path_leaves_everything_else_to_math_verify():
    verifier = MathVerifier()
    for content, gold in [(r"\frac{1}{2}", "0.5"), ("0.5", "1/2"), ("12.0", "12"), ("x^2", "x*x"),
                          ("1" * 16, "1" * 16), ("12", r"\frac{24}{2}"), ("1,000", "1000")]:
        assert verifier.settle(rf"\boxed{{{content}}}", gold) is None, content
    # what the parser-free precheck rejects is settled, with its reason
    assert verifier.settle("no box here", "3") == Verdict(0.0, "no \\boxed{} answer")
    assert verifier.settle(r"\boxed{7", "7") == Verdict(0.0, "unbalanced \\boxed{")
    assert verifier.settle("x" * 20_000, "7").reason == "no \\boxed{} answer (capped: judged the last 10000 of 20000 chars)"
    # and verify_batch agrees with and without the fast path
    pairs = [(r"\boxed{007}", "7"), (r"\boxed{-3}", "3"), (r"\boxed{+0}", "-0"), (r"\boxed{\frac{1}{2}}", "0.5")]
    with MathVerifier(settle_integers=False) as slow:  # every boxed answer through math-verify
        assert slow.settle(r"\boxed{7}", "7") is None
        assert verifier.verify_batch(pairs[:3]) == slow.verify_batch(pairs[:3])
        assert slow._worker is not None, "math-verify's child judged the integers"
        assert verifier.verify_batch(pairs) == slow.verify_batch(pairs)
    verifier.close()


# ----------------------------------------------------------------------------- Ray


@pytest.fixture(scope="module")
def pool(ray_local):
    pool = VerifierPool(2, timeout_s=TIMEOUT_S)
    yield pool
    pool.shutdown()


def test_pool_returns_verdicts_in_order(pool, ray_local):
    pairs = [
        (r"\boxed{\frac{1}{2}}", "0.5"),
        (r"\boxed{12}", "13"),
        (HANG, "1"),
        ("", "1"),
        (r"\boxed{x^2}", "x*x"),
        (r"\boxed{7", "7"),
        (r"\boxed{3}", "3"),
    ]
    expected = ["correct", "wrong answer", "timeout after 0.5s", "empty", "correct",
                "unbalanced \\boxed{", "correct"]
    assert [v.reason for v in pool.verify_batch(pairs)] == expected
    refs = pool.verify_batch_async(pairs[:1])
    assert len(refs) == 1 and ray_local.get(refs) == [[Verdict(1.0, "correct")]]
    assert pool.verify_batch([]) == []


def test_pool_settles_integer_answers_without_a_round_trip(ray_local):
    """With every actor dead, answers the fast path settles still get their verdicts (they
    never reach an actor); an answer that needs math-verify does reach one, and fails."""
    pool = VerifierPool(2, timeout_s=TIMEOUT_S)
    assert [v.reason for v in pool.verify_batch([(r"\boxed{2}", "2"), (r"\boxed{3}", "2")])] == \
        ["correct", "wrong answer"]
    for actor in pool.actors:
        ray_local.kill(actor)
    settled = [(r"\boxed{12}", "12"), (r"\boxed{+12}", "12"), (r"\boxed{13}", "12"), ("", "12"),
               ("no box", "12")]
    assert [v.reason for v in pool.verify_batch(settled)] == \
        ["correct", "correct", "wrong answer", "empty", "no \\boxed{} answer"]
    with pytest.raises(ray_local.exceptions.RayActorError):
        pool.verify_batch([*settled, (r"\boxed{\frac{1}{2}}", "0.5")])
    pool.fast_path = False  # data.fast_path: false sends every answer to an actor
    with pytest.raises(ray_local.exceptions.RayActorError):
        pool.verify_batch(settled)
    pool.shutdown()


def test_pool_rejects_bad_config(ray_local):
    with pytest.raises(ValueError, match="data.verifier: unknown verifier .nope."):
        VerifierPool(1, verifier="nope")
    with pytest.raises(ValueError, match="num_actors"):
        VerifierPool(0)
