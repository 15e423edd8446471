"""The rehearsal's data set (``make rehearsal``): a local parquet file of math problems with
``problem`` and ``answer`` columns, the shape a user's own data set has (``data.train.source:
file``), judged by the math verifier. The answers are integers, fractions and expressions in
LaTeX, so that math-verify compares them as values, not as strings."""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def _problem(rng: random.Random) -> tuple[str, str]:
    """One problem and its answer, of one of four kinds."""
    a, b, c = rng.randint(2, 40), rng.randint(2, 40), rng.randint(2, 9)
    kind = rng.randrange(4)
    if kind == 0:
        return f"What is {a} * {b} + {c}?", str(a * b + c)
    if kind == 1:
        return f"Simplify the fraction {a * c}/{b * c} to lowest terms.", _fraction(a, b)
    if kind == 2:
        return f"Solve for x: {c}x + {a} = {a + c * b}.", str(b)
    return f"Expand ({c}x + {a})^2.", f"{c * c}x^2 + {2 * a * c}x + {a * a}"


def _fraction(p: int, q: int) -> str:
    """p/q in lowest terms, as LaTeX (an integer when q divides p)."""
    from math import gcd

    g = gcd(p, q)
    p, q = p // g, q // g
    return str(p) if q == 1 else f"\\frac{{{p}}}{{{q}}}"


def write_math_parquet(path: Path, rows: int, seed: int = 0) -> Path:
    """Write ``rows`` seeded problems to ``path`` (parquet, columns ``problem`` and ``answer``)."""
    rng = random.Random(seed)
    problems = [_problem(rng) for _ in range(rows)]
    table = pa.table({"problem": [p for p, _ in problems], "answer": [a for _, a in problems]})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path
