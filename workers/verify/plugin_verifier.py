"""Reward-function plugins: ``data.verifier: python:package.module:function`` or
``python:/path/to/file.py:function``.

The function is called as ``fn(question, response, answer, metadata)`` and returns a reward
in [0, 1], or ``(reward, reason)``. ``question`` is the problem text without the instruction,
``answer`` the gold answer, ``metadata`` a dict: ``task``, ``prompt_id`` and, for a loaded
file, the row's other columns. Example: ``examples/reward_plugin.py``.

A plugin is user code judging untrusted text, so it gets the math verifier's protection
(``workers.verify.math_verifier.ChildProcessVerifier``): it runs in a persistent child process of
each verifier actor, never in the driver (the verifier has no ``settle``, so
``VerifierPool`` sends every answer to its actors), with at most ``timeout_s`` of the child's CPU
time per answer (10 x it of wall clock at most: ``workers.verify.cpu_limit``);
an answer that overruns gets reward 0 and the child is SIGKILLed and started again. An
exception, a result that is not a number, NaN or a value outside [0, 1] gives reward 0 with
the reason ``plugin NAME failed: ...``; each such failure is counted (:attr:`failures`),
logged (the first ones, then every 1000th) and, per step, reported as
``train/plugin_failures``. Nothing a plugin does stops the run, except a plugin that cannot
be loaded at all, which fails the run at start-up (:meth:`PluginVerifier.check`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import math
import numbers
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from workers.verify.math_verifier import ChildProcessVerifier
from workers.verify.verifier import (
    CAPPED,
    PLUGIN_FAILED,
    PLUGIN_PREFIX,
    Item,
    Query,
    Verdict,
    _check_limits,
    _clip,
    is_plugin_failure,
    is_timeout,
    is_unjudged,
    register_verifier,
)

log = logging.getLogger(__name__)

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_FUNCTION = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
FAILED = PLUGIN_FAILED
SAID = "(plugin) "
"""Put before a plugin's own reason that reads as a verifier's or a plugin's failure (``error: ...``,
``timeout after ...``, ``plugin NAME failed: ...``): ``verify/failures``, ``verify/timeouts`` and
``train/plugin_failures`` count the verifier's and the plugin call's failures, not the plugin's
verdicts. A ``(capped: `` in the plugin's reason loses its colon, so ``verify/capped`` counts
only the responses refused for ``max_chars``."""
LOGGED_FAILURES = 20  # failures logged one by one; after these, every 1000th


def split_target(target: str) -> tuple[str, str]:
    """``module.path:function`` or ``path/to/file.py:function`` -> (module or file, function);
    a malformed target raises ValueError saying what is expected."""
    where, sep, function = target.rpartition(":")
    expected = ("expected python:package.module:function or python:/path/to/file.py:function, "
                f"got python:{target}")
    if not sep or not where or not _FUNCTION.match(function):
        raise ValueError(expected)
    if not where.endswith(".py") and not _MODULE.match(where):
        raise ValueError(expected)
    return where, function


def check_target(target: str) -> str:
    """The target as written, checked; raises ValueError when it is malformed, the file does
    not exist or the module cannot be found. A file path stays as written (relative to the
    working directory), so the run folder's ``config.yaml`` holds it so: a job re-submitted with
    ``--resume`` from another unpacked copy of the project (``ray job submit --working-dir``
    after a head restart or an edit) has the same config. :func:`absolute_verifier` makes it
    absolute where the verifier actors start. Does not import the plugin (that happens in a
    child process: :meth:`PluginVerifier.check`)."""
    where, _ = split_target(target)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise ValueError(f"reward plugin python:{target}: no file {path}")
        return target
    try:
        found = importlib.util.find_spec(where)
    except (ImportError, ValueError) as exc:
        raise ValueError(f"reward plugin python:{target}: cannot find module {where!r} ({exc})") from None
    if found is None:
        raise ValueError(f"reward plugin python:{target}: no module {where!r} on the Python path")
    return target


def absolute_verifier(verifier: str) -> str:
    """``data.verifier`` with a plugin file's path made absolute in this process's working
    directory (the verifier actors may run in another); any other verifier as it is."""
    if not verifier.startswith(PLUGIN_PREFIX):
        return verifier
    where, function = split_target(verifier[len(PLUGIN_PREFIX):])
    if not where.endswith(".py"):
        return verifier
    return f"{PLUGIN_PREFIX}{Path(where).expanduser().resolve()}:{function}"


def load_function(target: str) -> Callable[..., Any]:
    """Import the plugin and return its function (in the child process)."""
    where, function = split_target(target)
    if where.endswith(".py"):
        path = Path(where).expanduser().resolve()
        name = f"graftpool_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    fn = getattr(module, function, None)
    if fn is None:
        raise AttributeError(f"{where} has no {function!r}")
    if not callable(fn):
        raise TypeError(f"{where}.{function} is not callable")
    return fn


def plugin_reward(fn: Callable[..., Any], label: str, item: Item) -> tuple[float, str]:
    """One call of the plugin, its result checked: ``(reward, reason)``, reward 0 and
    ``plugin LABEL failed: ...`` for an exception or a bad result."""
    response, answer = item[0], item[1]
    question = item[2] if len(item) > 2 else ""
    metadata = dict(item[3] or {}) if len(item) > 3 else {}
    failed = f"plugin {label}{FAILED}"
    try:
        result = fn(question, response, answer, metadata)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a plugin's error is a 0 reward
        return 0.0, _uncapped(f"{failed}raised {type(exc).__name__}: {_clip(str(exc))}")
    reason = None
    if isinstance(result, tuple | list) and len(result) == 2:
        result, reason = result
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        return 0.0, _uncapped(f"{failed}returned {_clip(repr(result))} (not a number)")
    reward = float(result)
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):
        return 0.0, f"{failed}returned {reward!r} (not in [0, 1])"
    if reason is None:
        reason = "correct" if reward == 1.0 else "wrong answer" if reward == 0.0 else f"reward {reward:.4g}"
    reason = _clip(str(reason), 200)
    if is_unjudged(reason) or is_timeout(reason) or is_plugin_failure(reason):  # the plugin's words, not a failure
        reason = f"{SAID}{reason}"
    return reward, _uncapped(reason)  # verify/capped counts the verifier's refusals, not the plugin's words


def _uncapped(reason: str) -> str:
    """``reason`` with a ``(capped: `` in a plugin's words (its reason, its exception's text, its
    bad result's repr) made ``(capped ``: only the verifier's ``max_chars`` refusals count in ``verify/capped``."""
    return reason.replace(CAPPED, "(capped ")


def _plugin_setup(target: str, label: str) -> Callable[[Item, dict], tuple[float, str]]:
    """The plugin child's set-up: import the plugin once, then judge items with it."""
    fn = load_function(target)
    return lambda item, cache: plugin_reward(fn, label, item)


@register_verifier("python")
class PluginVerifier(ChildProcessVerifier):
    """A reward-function plugin (module docstring) under a hard per-answer time limit.

    ``target`` is what follows ``python:`` in ``data.verifier``. Responses longer than
    ``max_chars`` (``data.max_response_chars``) get reward 0 ("too long (capped: ...)") without
    a call, so that no plugin is handed a runaway generation. Refused, not cut to their tail as
    the boxed-answer verifiers' are (``workers.verify.verifier.cap_tail``): a plugin judges the
    whole response (its format, its length), so a tail could earn a reward the response would
    not. No ``settle``: nothing is judged in the driver.
    """

    takes_context = True

    def __init__(self, target: str, timeout_s: float = 2.0, max_chars: int = 10_000,
                 startup_timeout_s: float = 60.0) -> None:
        _check_limits(timeout_s, max_chars)
        self.target = target
        where, function = split_target(target)
        self.label = f"{Path(where).name if where.endswith('.py') else where}:{function}"
        self.reason_prefix = f"plugin {self.label}{FAILED}"
        super().__init__(timeout_s, startup_timeout_s, name="graftpool-reward-plugin")
        self.max_chars = max_chars
        self.failures: Counter[str] = Counter()  # kind ("raised", "returned", "timeout", ...) -> count

    def _child_setup(self) -> tuple[Callable[..., Any], tuple]:
        return _plugin_setup, (self.target, self.label)

    def check(self) -> None:
        """Load the plugin in the child; raise ValueError naming the plugin if it cannot."""
        try:
            super().check()
        except ValueError as exc:
            raise ValueError(f"data.verifier: reward plugin python:{self.target}: {exc}") from None

    def verify(self, response: str, answer: str, question: str = "",
               metadata: Mapping[str, Any] | None = None) -> Verdict:
        return self.verify_batch([Query(response, answer, question, metadata)])[0]

    def verify_batch(self, items: Sequence[Item]) -> list[Verdict]:
        verdicts: list[Verdict | None] = []
        todo: list[tuple[int, Query]] = []
        for index, item in enumerate(items):
            response, answer = item[0], item[1]
            if not isinstance(response, str):
                verdicts.append(Verdict(0.0, f"error: response is {type(response).__name__}, not str"))
            elif len(response) > self.max_chars:
                verdicts.append(Verdict(0.0, f"too long {CAPPED}{len(response)} chars > {self.max_chars})"))
            else:
                verdicts.append(None)
                question = item[2] if len(item) > 2 else ""
                metadata = dict(item[3] or {}) if len(item) > 3 else {}
                todo.append((index, Query(response, str(answer), str(question), metadata)))
        if todo:
            try:
                with self._lock:
                    judged = self._judge([query for _, query in todo])
            except Exception as exc:
                said = f"{self.reason_prefix}error: {type(exc).__name__}: {_clip(str(exc))}"
                judged = [Verdict(0.0, _uncapped(said))] * len(todo)
            for (index, _), verdict in zip(todo, judged, strict=True):
                verdicts[index] = verdict
                if is_plugin_failure(verdict.reason):
                    self._count(verdict.reason)
        return [v if v is not None else Verdict(0.0, "error: not judged") for v in verdicts]

    def _count(self, reason: str) -> None:
        kind = reason.split(FAILED, 1)[1].split(" ", 1)[0]
        self.failures[kind] += 1
        total = sum(self.failures.values())
        if total <= LOGGED_FAILURES or total % 1000 == 0:
            log.warning("%s (%d plugin failures so far: %s)", reason, total, dict(self.failures))
