"""The ``reasoning_gym`` verifier: each problem scored by its own dataset's ``score_answer``.

``data.verifier: reasoning_gym`` goes with ``source: reasoning_gym`` data
(``graftpool.rg_tasks``): a problem's metadata holds its dataset's name, generator settings and
the generated entry, and the response's final ``\\boxed{}`` content is the answer given to
``dataset.score_answer(answer, entry)``. The reward is whatever the dataset gives, in [0, 1]
(some give partial credit: a success is a reward above 0.5, as for every verifier).

The scorers are reasoning-gym's code judging untrusted text, so they run as the math verifier
and the reward plugins do (``workers.verify.math_verifier.ChildProcessVerifier``): in a persistent
child process of each verifier actor, at most ``timeout_s`` of its CPU time per answer (10 x it of
wall clock at most: ``workers.verify.cpu_limit``), after which the child is
SIGKILLed and started again. A scorer that raises or returns no number in [0, 1] gives 0 with
the reason ``reasoning_gym DATASET failed: ...``. A response without a (balanced) ``\\boxed{}``
is given to the scorer as no answer (``None``), an empty box as ``""``: some datasets give a
small reward even then (0.01 for a missing answer), and the scorer decides. The box is looked
for in the response's last ``max_chars`` characters (``workers.verify.verifier.cap_tail``: the
final answer is at the end), and a response that was longer has a `` (capped: ...)`` note.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from graftpool.rg_tasks import DATASET_KEY, ENTRY_KEY, SETTINGS_KEY
from workers.verify.answer import extract_boxed
from workers.verify.math_verifier import ChildProcessVerifier
from workers.verify.verifier import (
    Item,
    Verdict,
    _check_limits,
    _clip,
    cap_tail,
    noted,
    register_verifier,
)

NOT_RG = "not a reasoning-gym problem (data.verifier: reasoning_gym needs source: reasoning_gym data)"


def rg_reward(dataset: Any, name: str, answer: str | None, entry: Mapping[str, Any]) -> tuple[float, str]:
    """``dataset.score_answer(answer, entry)`` checked: ``(reward, reason)``; 0 and
    ``reasoning_gym NAME failed: ...`` for an exception or a result outside [0, 1]."""
    failed = f"reasoning_gym {name} failed: "
    try:
        result = dataset.score_answer(answer, dict(entry))
    except Exception as exc:  # noqa: BLE001 - a scorer's error is a 0 reward
        return 0.0, f"{failed}raised {type(exc).__name__}: {_clip(str(exc))}"
    if isinstance(result, bool) or not isinstance(result, numbers.Real) or not math.isfinite(float(result)) \
            or not 0.0 <= float(result) <= 1.0:
        return 0.0, f"{failed}returned {_clip(repr(result))} (not a number in [0, 1])"
    reward = float(result)
    return reward, "correct" if reward == 1.0 else "wrong answer" if reward == 0.0 else f"partial {reward:.4g}"


def _rg_setup() -> Callable[[tuple, dict], tuple[float, str]]:
    """The child's set-up: import reasoning-gym once; datasets are built on first use and kept
    (scoring needs a dataset's settings, not its seed or size)."""
    from graftpool.rg_tasks import create, require

    require()
    datasets: dict[str, Any] = {}

    def judge(item: tuple, cache: dict) -> tuple[float, str]:
        answer, name, settings, entry = item
        key = f"{name}\n{settings}"
        if key not in datasets:
            datasets[key] = create(name, json.loads(settings))
        return rg_reward(datasets[key], name, answer, entry)

    return judge


@register_verifier("reasoning_gym")
class ReasoningGymVerifier(ChildProcessVerifier):
    """reasoning-gym's own scorers under a hard per-answer time limit (module docstring)."""

    takes_context = True
    check_at_start = False  # the source's config check has already built every dataset

    # importing reasoning-gym (sympy, matplotlib, ...) takes 4 s on an idle machine, and was seen
    # to take 25-60 s on a loaded one: the child's start-up gets more than math-verify's 60 s
    def __init__(self, timeout_s: float = 2.0, max_chars: int = 10_000, startup_timeout_s: float = 300.0) -> None:
        _check_limits(timeout_s, max_chars)
        super().__init__(timeout_s, startup_timeout_s, name="graftpool-reasoning-gym")
        self.reason_prefix = "reasoning_gym: "
        self.max_chars = max_chars

    def _child_setup(self) -> tuple[Callable[..., Any], tuple]:
        return _rg_setup, ()

    @staticmethod
    def _precheck(response: object) -> Verdict | None:
        if not isinstance(response, str):
            return Verdict(0.0, f"error: response is {type(response).__name__}, not str")
        return None

    def settle(self, response: str, answer: str) -> Verdict | None:
        """Reward 0 in the driver for a response that is no string; the rest goes to a scorer."""
        return self._precheck(response)

    def verify(self, response: str, answer: str, question: str = "",
               metadata: Mapping[str, Any] | None = None) -> Verdict:
        return self.verify_batch([(response, answer, question, metadata)])[0]

    def verify_batch(self, items: Sequence[Item]) -> list[Verdict]:
        verdicts: list[Verdict | None] = []
        todo: list[tuple[int, tuple]] = []
        notes: dict[int, str] = {}  # cap_tail's notes
        for index, item in enumerate(items):
            try:
                metadata = (item[3] if len(item) > 3 else None) or {}
                checked = self._precheck(item[0]) or (None if ENTRY_KEY in metadata else Verdict(0.0, NOT_RG))
                text, notes[index] = cap_tail(item[0], self.max_chars) if checked is None else ("", "")
                answer = extract_boxed(text) if checked is None else None
            except Exception as exc:  # noqa: BLE001 - the contract is "never raises"
                checked = Verdict(0.0, f"error: {type(exc).__name__}: {_clip(str(exc))}")
            if checked is not None:
                verdicts.append(checked)
            else:
                verdicts.append(None)
                settings = json.dumps(dict(metadata.get(SETTINGS_KEY) or {}), sort_keys=True)
                todo.append((index, (answer, str(metadata[DATASET_KEY]), settings, metadata[ENTRY_KEY])))
        if todo:
            try:
                with self._lock:
                    judged = self._judge([item for _, item in todo])
            except Exception as exc:  # noqa: BLE001
                judged = [Verdict(0.0, f"error: {type(exc).__name__}: {_clip(str(exc))}")] * len(todo)
            for (index, _), verdict in zip(todo, judged, strict=True):
                verdicts[index] = noted(verdict, notes.get(index, ""))
        return [v if v is not None else Verdict(0.0, "error: not judged") for v in verdicts]
