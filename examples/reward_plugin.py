"""An example reward plugin: exact match of the boxed answer, penalised for length.

Use it with ``data.verifier: python:examples/reward_plugin.py:length_penalised`` (a file
path, relative to where you start the run) or, with the repository on the Python path,
``python:examples.reward_plugin:length_penalised``. GraftPool calls
``fn(question, response, answer, metadata)`` in its verifier actors, each call in a child
process under ``data.verifier_timeout_s``; the result is a reward in [0, 1] or
``(reward, reason)``. Anything else (an exception, a timeout, NaN, a value outside [0, 1])
scores 0 with a reason naming the plugin, and the run goes on. See docs/config.md.
"""

from __future__ import annotations

import re

BUDGET = 40  # characters a response may use before the penalty starts
PENALTY_PER_CHAR = 0.002  # reward lost per character over the budget
FLOOR = 0.6  # a right answer never scores below this (a success: reward > 0.5)

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def length_penalised(question: str, response: str, answer: str, metadata: dict) -> tuple[float, str]:
    """1.0 for the right boxed answer within BUDGET characters, down to FLOOR for a long
    one; 0.0 for a wrong or missing answer. ``metadata`` has ``task`` and ``prompt_id``
    (and a loaded file's other columns)."""
    found = _BOXED.findall(response)
    if not found:
        return 0.0, "no \\boxed{} answer"
    if found[-1].strip() != answer.strip():
        return 0.0, "wrong answer"
    over = max(0, len(response) - BUDGET)
    reward = max(FLOOR, 1.0 - PENALTY_PER_CHAR * over)
    return reward, "correct" if over == 0 else f"correct, {over} chars over budget"
