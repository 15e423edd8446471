"""The ``math`` verifier: math-verify equivalence under a hard per-answer time limit, in a
persistent child process that is SIGKILLed and restarted when one answer overruns (see
``workers.verify.verifier`` for why signal-based timeouts cannot work inside a Ray actor).

The child-process machinery is :class:`ChildProcessVerifier`, shared with the reward-function
plugins (``workers.verify.plugin_verifier``): a subclass names the function that sets the child up
(:meth:`ChildProcessVerifier._child_setup`) and a prefix for its failure reasons."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
import signal
import threading
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from workers.verify.answer import e_notation_as_latex
from workers.verify.cpu_limit import wait_result
from workers.verify.verifier import (
    CORRECT,
    WRONG,
    Pair,
    Verdict,
    _check_limits,
    _clip,
    _precheck,
    noted,
    register_verifier,
)

# ----------------------------------------------------------------------------- math

_PLAIN_INTEGER = re.compile(r"[+-]?\d{1,15}")
"""An integer math-verify judges as such: sign, 1-15 digits, nothing else."""


def _integer_verdict(content: str, answer: object) -> Verdict | None:
    """Boxed integer vs integer gold: the verdict math-verify gives (see MathVerifier.settle)."""
    gold = str(answer).strip()
    if _PLAIN_INTEGER.fullmatch(content) and _PLAIN_INTEGER.fullmatch(gold):
        return CORRECT if int(content) == int(gold) else WRONG
    return None


class ChildProcessVerifier:
    """A persistent ``spawn`` child process that judges items one at a time under a hard
    per-item limit on its CPU time (``timeout_s``, with a 10x wall-clock backstop:
    ``workers.verify.cpu_limit``): SIGKILLed and restarted when one item overruns or the child dies.

    A child that dies while judging an item (an outside SIGKILL: the OOM killer, a chaos test)
    is restarted and the item judged again, :attr:`crash_retries` times (1), so a lost child
    changes no verdict; an item that kills every child it is sent to gets "verifier crashed".
    A child that dies during its start-up is started again as often.

    The child runs :func:`_worker_main` with ``self._child_setup()``: a picklable top-level
    function and its arguments, called once in the child before it says it is ready, that
    returns ``judge(item, batch_cache) -> (reward, reason)``. A setup that raises makes the
    child report the error instead of "ready" (:meth:`check` raises it; a batch gets
    "verifier unavailable: ..."). Reasons the parent writes (timeout, crash, unavailable)
    start with ``reason_prefix``. Thread-safe (one lock around the child); ``close()`` or
    garbage collection stops it.
    """

    reason_prefix = ""
    crash_retries = 1  # more children an item may see die under it before "verifier crashed"

    def __init__(self, timeout_s: float, startup_timeout_s: float = 60.0, name: str = "graftpool-verifier") -> None:
        self.timeout_s = float(timeout_s)
        self.startup_timeout_s = startup_timeout_s
        self._process_name = name
        self._worker: _Worker | None = None
        self._lock = threading.Lock()

    def _child_setup(self) -> tuple[Callable[..., Any], tuple]:
        """``(setup, args)`` for the child: ``setup(*args)`` returns its judge function."""
        raise NotImplementedError

    def check(self) -> None:
        """Start the child and wait for it to be ready; raise ValueError with the reason if it
        cannot start (e.g. a plugin that does not import). The child stays up for later use."""
        with self._lock:
            worker = self._ready_worker()
        if isinstance(worker, str):
            raise ValueError(worker)

    def _judge(self, items: list) -> list[Verdict]:
        """Run ``items`` through the child, restarting it past each timeout or crash.

        Any exception (or interrupt) half-way stops the child, so that results still in the
        pipe can never be read as answers to the next batch.
        """
        out: list[Verdict] = []
        send_failures = 0
        crashes = 0  # children that died under the item at len(out)
        try:
            while len(out) < len(items):
                worker = self._ready_worker()
                if isinstance(worker, str) or send_failures >= 2:
                    why = worker if isinstance(worker, str) else "cannot send to the child"
                    failed = Verdict(0.0, f"{self.reason_prefix}verifier unavailable: {why}")
                    out += [failed] * (len(items) - len(out))
                    break
                try:
                    worker.conn.send(items[len(out) :])
                except OSError:  # the child died since the liveness check
                    send_failures += 1
                    self._restart()
                    continue
                send_failures = 0
                while len(out) < len(items):
                    late = wait_result(worker.conn, worker.process.pid, self.timeout_s)  # CPU time (cpu_limit)
                    if late is not None:
                        out.append(Verdict(0.0, f"{self.reason_prefix}{late}"))
                        crashes = 0
                        self._restart()
                        break
                    try:
                        reward, reason = worker.conn.recv()
                    except (EOFError, OSError):
                        crashes += 1
                        if crashes > self.crash_retries:  # the item kills its children
                            out.append(Verdict(0.0, f"{self.reason_prefix}verifier crashed"))
                            crashes = 0
                        self._restart()  # and the rest of the batch (this item too, if retried) resent
                        break
                    out.append(Verdict(float(reward), str(reason)))
                    crashes = 0
        except BaseException:
            self._stop()
            raise
        return out

    def _ready_worker(self) -> _Worker | str:
        """The running child, started (and waited for) if needed; a string says why not. A
        child that dies during its start-up is started again, :attr:`crash_retries` times."""
        for attempt in range(self.crash_retries + 1):
            if self._worker is None or not self._worker.process.is_alive():
                self._restart()
            worker = self._worker
            assert worker is not None
            if worker.ready:
                return worker
            try:
                if not worker.conn.poll(self.startup_timeout_s):
                    self._stop()
                    return f"no start-up within {self.startup_timeout_s:g}s"
                message = worker.conn.recv()
            except (EOFError, OSError) as exc:
                self._stop()
                if attempt < self.crash_retries:
                    continue
                return f"child died at start-up ({type(exc).__name__})"
            if message != _READY:  # ("error", text): the setup raised
                self._stop()
                return f"start-up failed: {message[1] if isinstance(message, tuple) else message}"
            worker.ready = True
            return worker
        raise AssertionError("unreachable")

    def _restart(self) -> None:
        """Kill the current child (if any) and start a new one at once, so that its start-up
        overlaps with whatever the caller does before the next batch."""
        self._stop()
        ctx = mp.get_context("spawn")
        parent_conn, child_conn = ctx.Pipe(duplex=True)
        setup, setup_args = self._child_setup()
        process = ctx.Process(
            target=_worker_main,
            args=(child_conn, os.getpid(), setup, setup_args),
            name=self._process_name,
            daemon=True,
        )
        process.start()
        child_conn.close()
        self._worker = _Worker(process, parent_conn)
        self._worker.finalizer = weakref.finalize(self, _kill, process, parent_conn)

    def _stop(self) -> None:
        if self._worker is not None:
            self._worker.finalizer()  # runs _kill once
            self._worker = None

    def close(self) -> None:
        """Stop the child process; a later call starts a new one."""
        with self._lock:
            self._stop()

    def __enter__(self) -> ChildProcessVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



@register_verifier("math")
class MathVerifier(ChildProcessVerifier):
    """math-verify equivalence (``\\boxed{1/2}`` == ``0.5``) under a hard per-answer timeout.

    The boxed content and the gold answer are each parsed as ``\\boxed{<text>}`` (so a gold
    answer written bare, as ``$12$`` or as ``\\boxed{12}`` all parse alike) and compared with
    ``math_verify.verify(gold, prediction)``.

    All math-verify work happens in one persistent child process (``spawn`` context: safe in
    the multi-threaded Ray worker, unlike ``fork``). A batch goes over a pipe as one message
    and the child streams back one result per answer; the parent waits for each next result
    while the child has used less than ``timeout_s`` of CPU time on it (a child waiting for a
    core is not failed for the wait; 10 x ``timeout_s`` of wall clock at most:
    ``workers.verify.cpu_limit``). When it does not come, the answer being worked on gets
    "timeout after Xs", the child is SIGKILLed and a fresh one started, and the rest of the
    batch is resent to it. The price of a timeout is therefore at least ``timeout_s`` of wall
    clock (more on a busy node, 10 x it at most) plus one child start-up (0.5-1 s: interpreter,
    sympy and math-verify imports), paid only by that batch;
    the child's start-up itself is never counted against ``timeout_s``. As with any "spawn"
    child, a script that uses this at top level needs an ``if __name__ == "__main__":`` guard
    (Ray workers, pytest and console scripts have one). Thread-safe (one lock around the
    child); ``close()`` or garbage collection stops it.
    """

    def __init__(
        self,
        timeout_s: float = 2.0,
        max_chars: int = 10_000,
        startup_timeout_s: float = 60.0,
        settle_integers: bool = True,
    ) -> None:
        _check_limits(timeout_s, max_chars)
        super().__init__(timeout_s, startup_timeout_s, name="graftpool-math-verify")
        self.max_chars = max_chars
        # False: boxed integers go to math-verify in the child too (the same verdicts, slower;
        # the chaos test uses it so that the children are really at work when they are killed)
        self.settle_integers = settle_integers

    def _child_setup(self) -> tuple[Callable[..., Any], tuple]:
        return _math_setup, ()

    def verify(self, response: str, answer: str) -> Verdict:
        return self.verify_batch([(response, answer)])[0]

    def settle(self, response: str, answer: str) -> Verdict | None:
        """The verdict without math-verify where it is certain, else None (the fast path).

        Settled here: what the parser-free precheck rejects (empty, no or an unbalanced
        ``\\boxed{}`` in the response's last ``max_chars`` characters), and a boxed integer against an integer gold answer (both
        ``[+-]?`` and 1-15 digits): math-verify parses both as sympy Integers and calls them
        equal exactly when ``int(content) == int(answer)`` (``007`` == ``7``, ``+7`` == ``7``,
        ``-0`` == ``0``), so the reward and reason are the ones it would give
        (``tests/test_verifier.py`` checks this against math-verify itself). Anything else
        (fractions, decimals, expressions, LaTeX, big numbers) goes to math-verify."""
        try:
            checked, note = _precheck(response, self.max_chars)
            if isinstance(checked, Verdict):
                return checked
            settled = _integer_verdict(checked, answer) if self.settle_integers else None
            return noted(settled, note) if settled is not None else None
        except Exception:  # noqa: BLE001 - math-verify's path reports the error itself
            return None

    def verify_batch(self, pairs: Sequence[Pair]) -> list[Verdict]:
        """Judge ``pairs`` in order; one round trip to the child for the whole batch."""
        verdicts: list[Verdict | None] = []
        todo: list[tuple[int, str, str]] = []
        notes: dict[int, str] = {}  # cap_tail's notes of the answers judged in the child
        for index, pair in enumerate(pairs):
            try:
                response, answer = pair[0], pair[1]  # a Query's question and metadata are unused
                checked, note = _precheck(response, self.max_chars)
                if not isinstance(checked, Verdict) and self.settle_integers:
                    settled = _integer_verdict(checked, answer)  # the fast path
                    checked = noted(settled, note) if settled is not None else checked
            except Exception as exc:
                checked = Verdict(0.0, f"error: {type(exc).__name__}: {_clip(str(exc))}")
            if isinstance(checked, Verdict):
                verdicts.append(checked)
            else:
                verdicts.append(None)
                notes[index] = note
                todo.append((index, checked, str(answer)))
        if todo:
            try:
                with self._lock:
                    judged = self._judge([(content, gold) for _, content, gold in todo])
            except Exception as exc:
                failed = Verdict(0.0, f"error: {type(exc).__name__}: {_clip(str(exc))}")
                judged = [failed] * len(todo)
            for (index, _, _), verdict in zip(todo, judged, strict=True):
                verdicts[index] = noted(verdict, notes[index])
        return [v if v is not None else Verdict(0.0, "error: not judged") for v in verdicts]


class _Worker:
    """Parent-side handle of one child: process, pipe end, whether it said it is ready."""

    def __init__(self, process: mp.process.BaseProcess, conn: Connection) -> None:
        self.process = process
        self.conn = conn
        self.ready = False
        self.finalizer: Callable[[], Any] = lambda: None


def _kill(process: mp.process.BaseProcess, conn: Connection) -> None:
    """SIGKILL, not SIGTERM: a child stuck in a big-integer power never runs Python-level
    handlers, and nothing in it needs cleaning up."""
    try:
        conn.close()
        if process.is_alive():
            process.kill()
        process.join(timeout=5)
    except Exception:  # best effort, may run at interpreter exit
        pass


# ----------------------------------------------------------------------------- child side

_READY = "ready"


def _worker_main(conn: Connection, parent_pid: int,
                 setup: Callable[..., Any] | None = None, setup_args: tuple = ()) -> None:
    """Child process loop: ``judge = setup(*setup_args)``, then receive a batch of items and
    send one ``(reward, reason)`` per item as soon as it is judged, until the pipe closes.
    A setup that raises sends ``("error", text)`` instead of "ready" and ends the child.

    If the parent dies without closing the pipe (a Ray actor is SIGKILLed while this child is
    deep in sympy), the child must not live on burning a core: a 1 s interval timer checks
    that the parent pid is unchanged. A signal is used, not a thread, because the hung sympy
    code holds the GIL but does still run signal handlers between big-integer steps.
    """
    if hasattr(signal, "setitimer"):

        def _exit_if_orphaned(signum: int, frame: object) -> None:
            if os.getppid() != parent_pid:
                os._exit(0)

        signal.signal(signal.SIGALRM, _exit_if_orphaned)
        signal.setitimer(signal.ITIMER_REAL, 1.0, 1.0)
    try:
        try:
            judge = (setup or _math_setup)(*setup_args)
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {_clip(str(exc), 200)}"))
            return
        conn.send(_READY)
        while True:
            batch: list = conn.recv()
            cache: dict[str, Any] = {}  # per batch (math: GRPO batches repeat each gold n times)
            for item in batch:
                try:
                    result = judge(item, cache)
                except Exception as exc:
                    result = (0.0, f"error: {type(exc).__name__}")
                conn.send(result)
    except (EOFError, OSError, KeyboardInterrupt):
        return


def _math_setup() -> Callable[[Pair, dict], tuple[float, str]]:
    """The math child's set-up: imports and warm-up (numeric and symbolic paths) before
    "ready", so that no answer's time budget pays for first-use imports."""
    # math-verify logs a warning whenever its own (signal) timeouts are off; they are off on
    # purpose here, and a timed-out parse is reported by the parent.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    _math_compare("1", "1", {})
    _math_compare("x^2", "x*x", {})
    return _math_judge


def _math_judge(item: Pair, gold_cache: dict[str, list[Any]]) -> tuple[float, str]:
    content, gold = item
    return _math_compare(content, gold, gold_cache)


def _math_compare(content: str, gold: str, gold_cache: dict[str, list[Any]]) -> tuple[float, str]:
    """math-verify's verdict on ``content`` against ``gold``, each parsed as ``\\boxed{...}``
    after its e-notation numbers are written as LaTeX (:func:`e_notation_as_latex`)."""
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(), ExprExtractionConfig()]
    if gold not in gold_cache:
        gold_cache[gold] = parse("\\boxed{" + e_notation_as_latex(gold) + "}", config, parsing_timeout=None)
    gold_parsed = gold_cache[gold]
    if not gold_parsed:
        return 0.0, f"unparsable gold answer: {_clip(gold)}"
    predicted = parse("\\boxed{" + e_notation_as_latex(content) + "}", config, parsing_timeout=None)
    if not predicted:
        return 0.0, f"unparsable: {_clip(content)}"
    if verify(gold_parsed, predicted, timeout_seconds=None):
        return 1.0, "correct"
    return 0.0, "wrong answer"
