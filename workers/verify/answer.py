"""Pure string handling of model answers: find the final ``\\boxed{...}``, normalise for
exact match.

Kept apart from ``workers/verify/verifier.py`` so that it imports nothing heavy (no sympy, no Ray)
and can be unit-tested and fuzzed on its own. Every function here is linear in the length of
its input and never recurses, because its input is untrusted model output: a policy under RL
will sooner or later emit a megabyte of ``{`` or a thousand nested boxes.
"""

from __future__ import annotations

import re

__all__ = ["e_notation_as_latex", "extract_boxed", "has_boxed", "last_boxed_start", "normalize_exact"]

# ``\boxed{`` and the spaced form ``\boxed {`` that LaTeX also accepts. The pattern can only
# start at a backslash and ``\s*`` stops at the next ``\``, so finditer stays linear.
_BOXED_OPEN = re.compile(r"\\boxed\s*\{")
# Tokens that matter for brace matching: an escape (``\{``, ``\}``, ``\\``, ``\x`` ...) is
# consumed whole, so a literal brace never counts as grouping; bare braces do.
_BRACE_TOKEN = re.compile(r"\\.|[{}]", re.DOTALL)
_TRAILING_ZEROS = re.compile(r"^([+-]?\d+)\.0+$")
# A number in e-notation (``4.5e33``, ``1.6E-19``, ``.5e+3``), not inside a word or a longer number.
_E_NUMBER = re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")


def has_boxed(text: str) -> bool:
    """True if ``text`` contains a ``\\boxed{`` opener, balanced or not.

    Lets a caller tell "no boxed answer at all" from "a boxed answer that never closes"
    (typically a response cut off at the generation limit) when ``extract_boxed`` says None.
    """
    return _BOXED_OPEN.search(text) is not None


def last_boxed_start(text: str) -> int:
    """Where the last ``\\boxed{`` opener of ``text`` starts (the final answer's span, as
    :func:`extract_boxed` picks it), -1 where there is none."""
    start = -1
    for match in _BOXED_OPEN.finditer(text):
        start = match.start()
    return start


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text``, or None.

    "Last" means the ``\\boxed{`` opener that starts last, as in the MATH reference grader
    (``last_boxed_only_string``): the model's final answer is what it boxed last, so earlier
    boxes (drafts, restated sub-results) are ignored. For nested boxes this is the innermost
    one, ``\\boxed{\\boxed{3}}`` gives ``3``. If that last opener never closes, the result is
    None and no earlier box is used instead: a truncated final answer must not be silently
    replaced by a draft. Braces inside the content may nest to any depth; escaped braces
    ``\\{`` and ``\\}`` are literal characters in LaTeX and do not count. The content is
    returned as written, stripped of surrounding whitespace.

    Linear time and constant stack: one regex pass to find the last opener, one pass over the
    brace tokens after it with a depth counter.
    """
    start = -1
    for match in _BOXED_OPEN.finditer(text):
        start = match.end()
    if start < 0:
        return None
    depth = 1
    for token in _BRACE_TOKEN.finditer(text, start):
        char = token.group()
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[start : token.start()].strip()
    return None


def e_notation_as_latex(text: str) -> str:
    """Every e-notation number of ``text`` written as LaTeX: ``m e k`` -> ``m \\times 10^{k}``.

    math-verify reads ``4.5e33`` as 4.5 x e x 33 (Euler's number) and ``1.6e-19`` as
    1.6e - 19, so a gold answer in that notation (MinervaMath's physics answers) never
    equals the same value written ``4.5 \\times 10^{33}``. A number is rewritten only where
    digits (with an optional decimal point) stand directly before the ``e`` and an integer
    directly after it, not inside a word or a longer number; the rest is left as written."""
    return _E_NUMBER.sub(lambda m: f"{m.group(1)} \\times 10^{{{m.group(2)}}}", text)


def normalize_exact(text: str) -> str:
    """Trivial canonical form for the ``exact`` verifier.

    Only what a string comparison can defend: all whitespace removed (``x + 1`` == ``x+1``),
    one pair of surrounding ``$`` dropped, and an integer written with a zero fraction
    reduced to the integer (``12.0`` and ``12.00`` == ``12``). Nothing else: no case folding,
    no ``\\frac``/decimal equivalence, no ``\\text{}`` unwrapping. Use the ``math`` verifier
    for anything mathematical.
    """
    out = "".join(text.split())
    if len(out) >= 2 and out.startswith("$") and out.endswith("$"):
        out = out[1:-1]
    match = _TRAILING_ZEROS.match(out)
    if match is not None:
        out = match.group(1)
    return out
