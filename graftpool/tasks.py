"""Synthetic verifiable math tasks, generated in code and deterministic from a seed.

The platform runs real RL on CPU in tests, so the tasks are sized for tiny char-level
models: questions are a dozen characters ("12+35="), operands are small. Prompts take the
paper's format, the question followed by :data:`INSTRUCTION` ("... Output the final answer
within \\boxed{}."). The warm-start (SFT) solution is a short worked solution that first
restates the question next to its result, then boxes it: "12+35=47, \\boxed{47}". The
restatement brings the operands next to the answer, so tiny char-level models need not
attend back across the 41-character instruction (with answer-only targets they lose
most of their skill). Every task's question space is split once and for all into a train
part and an eval part by a hash of the question text, so any train set (any seed, any
size) is disjoint from any eval set. Local data files load into the same :class:`Problem`
records (:mod:`graftpool.data_files`).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

INSTRUCTION = " Output the final answer within \\boxed{}."
"""Appended to every question: the paper's prompt format (docs/algorithm.md, Notation: q)."""

EVAL_PERCENT = 20
"""Share (in percent) of every task's prompt space reserved for held-out evaluation."""

Split = Literal["train", "eval", "all"]


@dataclass(frozen=True)
class Problem:
    """One verifiable problem.

    ``prompt`` is what a model sees: ``question`` followed by the instruction.
    ``solution`` is the SFT target and ends with ``\\boxed{answer}``. ``metadata`` holds a
    loaded row's other columns (what a reward plugin is given besides task and prompt id).
    """

    prompt_id: str
    task: str
    question: str
    prompt: str
    answer: str
    solution: str
    metadata: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


def boxed(answer: str) -> str:
    """The canonical response text for an answer."""
    return f"\\boxed{{{answer}}}"


def worked_solution(question: str, answer: str) -> str:
    """The synthetic tasks' SFT target: the question restated with its result, then boxed."""
    return f"{question}{answer}, {boxed(answer)}"


def explained_solution(question: str, answer: str) -> str:
    """A longer, paper-like style (``explain``): prose around the worked line; the boxed final
    answer is a few percent of the tokens. ``We compute 12+35: 12+35=47. The answer is \\boxed{47}.``"""
    return f"We compute {question[:-1]}: {question}{answer}. The answer is {boxed(answer)}."


def stepwise_solution(question: str, answer: str) -> str:
    """Another paper-like style (``steps``), numbered steps with a check:
    ``Step 1: 12+35. Step 2: 12+35=47. Step 3: check 12+35=47. Final: \\boxed{47}.``"""
    return (f"Step 1: {question[:-1]}. Step 2: {question}{answer}. Step 3: check {question}{answer}. "
            f"Final: {boxed(answer)}.")


def prose_solution(question: str, answer: str) -> str:
    """A third paper-like style (``prose``), the result then a sentence around the box:
    ``Let us work out 12+35. Working: 12+35=47. Therefore the final answer is \\boxed{47}.``"""
    return f"Let us work out {question[:-1]}. Working: {question}{answer}. Therefore the final answer is {boxed(answer)}."


SOLUTION_STYLES: dict[str, Callable[[str, str], str]] = {
    "worked": worked_solution,
    "explain": explained_solution,
    "steps": stepwise_solution,
    "prose": prose_solution,
}
"""Warm-start solution templates (``models[].builder.solution_style``): two models warm-started
in different styles write differently, so the compatibility gate (Eq. 7) sees style as well
as correctness."""


def slipped_answer(answer: str) -> str:
    """The slip's result: the (integer) answer plus ten, never right by accident for the
    small-answer tasks, where an off-by-one computation plus one often would be."""
    return str(int(answer) + 10)


SLIPPED_STYLES: dict[str, Callable[[str, str], str]] = {
    "worked": lambda q, a: f"{q}{a}+10={slipped_answer(a)}, {boxed(slipped_answer(a))}",
    "explain": lambda q, a: (f"We compute {q[:-1]}: {q}{a}, plus 10: {slipped_answer(a)}. "
                             f"The answer is {boxed(slipped_answer(a))}."),
    "steps": lambda q, a: (f"Step 1: {q[:-1]}. Step 2: {q}{a}. Step 3: add 10, {a}+10={slipped_answer(a)}. "
                           f"Final: {boxed(slipped_answer(a))}."),
    "prose": lambda q, a: (f"Let us work out {q[:-1]}. Working: {q}{a}, and adding 10 gives {slipped_answer(a)}. "
                           f"Therefore the final answer is {boxed(slipped_answer(a))}."),
}
"""The warm start's slip in each style (``models[].builder.sft_slips``): after the correct result
the solution takes one wrong step, adding ten, and boxes that. A model warm-started on solutions
that slip at rate q on a task has the task's method and a habit of a wrong last step about q of
the time: the partial skill RL sharpens. The habit shows at one place (``.`` or ``,`` after the
result; ``check`` or ``add 10``), so a correct rollout on any prompt of the task teaches against it.
``SLIPPED_STYLES[style](question, answer)`` takes the correct answer.
"""

MISCOMPUTED_OFFSET = 11
"""What a ``result`` slip adds to the answer: eleven changes both of the last two digits (or the
length) of every answer, so no single wrong token turns the habitual result into the right one."""


def miscomputed_answer(answer: str) -> str:
    """The ``result`` slip's result: the (integer) answer plus :data:`MISCOMPUTED_OFFSET`."""
    return str(int(answer) + MISCOMPUTED_OFFSET)


def miscomputed_solution(style: str, question: str, answer: str) -> str:
    """The ``result`` slip: the style's own solution with a wrong result in place of the right one
    throughout (``We compute ds(124): ds(124)=18. The answer is \\boxed{18}.``). Unlike the
    ``last_step`` slip, the correct value is never written: a model warm-started on it cannot box
    the right answer by copying an earlier number, only by computing it."""
    return SOLUTION_STYLES[style](question, miscomputed_answer(answer))


SLIP_KINDS = ("last_step", "result")
"""``models[].builder.slip``: ``last_step`` (:data:`SLIPPED_STYLES`, the correct result then a
wrong last step) or ``result`` (:func:`miscomputed_solution`, a wrong result throughout)."""


def slipped_solution(kind: str, style: str, question: str, answer: str) -> str:
    """A warm-start solution that slips, of ``kind`` (:data:`SLIP_KINDS`) in ``style``."""
    if kind == "result":
        return miscomputed_solution(style, question, answer)
    if kind != "last_step":
        raise ValueError(f"expected a slip kind from {list(SLIP_KINDS)}, got {kind!r}")
    return SLIPPED_STYLES[style](question, answer)


def make_problem(
    task: str,
    question: str,
    answer: str,
    solution: str | None = None,
    instruction: str = INSTRUCTION,
    prompt_id: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> Problem:
    """Build a problem; its id is ``prompt_id`` if given, else a stable hash of task and
    prompt text.

    The prompt is ``question + instruction``; the solution defaults to the bare
    ``\\boxed{answer}`` (loaded data sets carry no worked solutions).
    """
    prompt = question + instruction
    if prompt_id is None:
        digest = hashlib.sha256(f"{task}\n{prompt}".encode()).hexdigest()[:12]
        prompt_id = f"{task}-{digest}"
    return Problem(prompt_id, task, question, prompt, answer, solution or boxed(answer), dict(metadata or {}))


def prompt_split(question: str) -> Literal["train", "eval"]:
    """Which side of the fixed train/eval partition a question text falls on."""
    bucket = int(hashlib.sha256(question.encode()).hexdigest()[:8], 16) % 100
    return "eval" if bucket < EVAL_PERCENT else "train"


# -- task generators: each draws one (prompt, answer) from a small operand space ----------


def _add(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(10, 49), rng.randint(10, 49)
    return f"{a}+{b}=", str(a + b)


def _sub(rng: random.Random) -> tuple[str, str]:
    a = rng.randint(10, 59)
    b = rng.randint(0, a)
    return f"{a}-{b}=", str(a - b)


def _mod(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(0, 99), rng.randint(2, 9)
    return f"{a}%{b}=", str(a % b)


def _linear(rng: random.Random) -> tuple[str, str]:
    a, x, b = rng.randint(2, 9), rng.randint(0, 9), rng.randint(0, 19)
    return f"{a}x+{b}={a * x + b},x=", str(x)


def _digits(rng: random.Random) -> tuple[str, str]:
    n = rng.randint(100, 999)
    return f"ds({n})=", str(sum(int(d) for d in str(n)))


def _count(rng: random.Random) -> tuple[str, str]:
    letter = rng.choice("abc")
    text = "".join(rng.choice("abcd") for _ in range(rng.randint(4, 7)))
    return f"{letter} in {text}=", str(text.count(letter))


TASKS: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "add": _add,
    "sub": _sub,
    "mod": _mod,
    "linear": _linear,
    "digits": _digits,
    "count": _count,
}
"""Registry of task kinds; add an entry to add a task."""


def check_task_mix(weights: Mapping[str, float]) -> None:
    """A task mix (name -> weight) :func:`generate_problems` can draw from: names from
    :data:`TASKS`, weights >= 0 with a positive sum; else a ValueError saying which."""
    unknown = sorted(set(weights) - set(TASKS))
    if unknown:
        raise ValueError(f"unknown task(s) {unknown}; known: {sorted(TASKS)}")
    if not weights or min(weights.values()) < 0 or sum(weights.values()) <= 0:
        raise ValueError(f"task weights must be non-negative with a positive sum: {dict(weights)}")


def generate_problems(
    tasks: Sequence[str] | Mapping[str, float],
    count: int,
    seed: int,
    split: Split = "all",
    exclude: Collection[str] = (),
    unique: bool = True,
    instruction: str = INSTRUCTION,
    style: str = "worked",
) -> list[Problem]:
    """Draw ``count`` problems with distinct prompts, deterministic in ``seed``; their SFT
    solutions are in ``style`` (:data:`SOLUTION_STYLES`).

    ``tasks`` is a list (uniform mix) or a mapping task -> weight (e.g. an SFT mix that
    over-weights some tasks). ``split`` keeps only prompts on that side of the fixed
    hash partition; ``exclude`` skips given question texts. Raises when a task's space
    is too small to supply distinct prompts. ``unique=False`` samples with
    replacement (SFT sets larger than a task's prompt space).
    """
    weights = dict(tasks) if isinstance(tasks, Mapping) else dict.fromkeys(tasks, 1.0)
    if style not in SOLUTION_STYLES:
        raise ValueError(f"unknown solution style {style!r}; known: {sorted(SOLUTION_STYLES)}")
    solve = SOLUTION_STYLES[style]
    check_task_mix(weights)
    rng = random.Random(seed)
    names, probs = list(weights), list(weights.values())
    seen = set(exclude)
    out: list[Problem] = []
    misses = 0
    while len(out) < count:
        task = rng.choices(names, probs)[0]
        question, answer = TASKS[task](rng)
        if question in seen or (split != "all" and prompt_split(question) != split):
            misses += 1
            if misses > 200 * count + 10_000:
                raise ValueError(f"could not draw {count} distinct {split} problems from {names}")
            continue
        if unique:
            seen.add(question)
        out.append(
            make_problem(task, question, answer, solve(question, answer), instruction)
        )
    return out
