"""Answers the math-verify tests share (tests/test_math_child.py, tests/test_verifier.py) and the
child's timeout they run with; the ``math_verifier`` fixture is in tests/conftest.py."""

# Sympy tries to evaluate 9^(9^(9^9)) as an integer and never finishes (measured: still
# running after 15 s); math-verify parses it in well under a second, so the time is spent in
# the comparison, inside the child process.
HANG = r"The answer is \boxed{9^{9^{9^{9}}}}"
TIMEOUT_S = 0.5
