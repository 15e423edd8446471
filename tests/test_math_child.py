"""The math verifier's child process (``workers.verify.math_verifier.ChildProcessVerifier``):
the hard per-answer timeout, and a child that dies, killed by the timeout, from outside while it
judges (the answer judged again by a new child, ``crash_retries``), during its start-up, or with
its parent. Real math-verify, real processes; no mocks. The rest of the verifier layer:
``tests/test_verifier.py``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.math_answers import HANG, TIMEOUT_S
from tests.test_response_cap import verify_metric
from workers.verify.math_verifier import MathVerifier
from workers.verify.verifier import Verdict, is_timeout


def test_math_timeout_is_zero_reward_and_bounded(math_verifier):
    start = time.monotonic()
    verdict = math_verifier.verify(HANG, "1")
    elapsed = time.monotonic() - start
    assert verdict == Verdict(0.0, "timeout after 0.5s")
    assert elapsed < TIMEOUT_S + 3.0
    # The child was killed and replaced: the verifier keeps working.
    assert math_verifier.verify(r"\boxed{2}", "2").reward == 1.0


def _stopped(pid: int, seconds: float) -> threading.Timer:
    """SIGSTOP ``pid`` now and SIGCONT it ``seconds`` later (from a timer thread; a child killed
    meanwhile is left alone): a child the scheduler leaves without a core that long."""
    def resume() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    os.kill(pid, signal.SIGSTOP)
    timer = threading.Timer(seconds, resume)
    timer.start()
    return timer


def test_a_child_waiting_for_a_core_past_the_limit_still_judges_its_answer():
    """``data.verifier_timeout_s`` limits the child's CPU time: a child stopped for three times
    the limit (as on a node with more children than cores) spends none of it, and its correct
    answer scores 1 once it runs again (with a wall-clock limit it scored 0, "timeout")."""
    with MathVerifier(timeout_s=1.0) as verifier:
        verifier.check()  # the child is up and idle
        resume = _stopped(verifier._worker.process.pid, 3.0)
        verdict = verifier.verify(r"\boxed{1/2}", "0.5")  # not an integer: judged in the child
        resume.join()
    assert verdict == Verdict(1.0, "correct")


def test_a_child_stopped_past_the_wall_clock_backstop_times_out():
    """A child that makes no progress at all is given up on after 10 x the limit of wall clock."""
    with MathVerifier(timeout_s=0.2) as verifier:
        verifier.check()
        resume = _stopped(verifier._worker.process.pid, 4.0)
        verdicts = verifier.verify_batch([(r"\boxed{1/2}", "0.5"), (r"\boxed{0.25}", "1/4")])
        resume.join()
    assert verdicts == [Verdict(0.0, "timeout after 2s wall clock"), Verdict(1.0, "correct")]


def test_a_child_spinning_past_its_cpu_limit_times_out_and_is_counted(math_verifier):
    """What the limit protects against: an expression sympy never finishes (the CPU limit's
    reason, not the backstop's), counted per model in ``verify/timeouts`` as a plugin's or
    reasoning-gym's timeout is, and nothing else."""
    verdicts = math_verifier.verify_batch([(HANG, "1"), (r"\boxed{1/2}", "0.5")])
    assert verdicts == [Verdict(0.0, "timeout after 0.5s"), Verdict(1.0, "correct")]
    reasons = [v.reason for v in verdicts] + ["plugin x failed: timeout after 2s", "reasoning_gym: timeout after 2s",
                                              "unparsable: timeout after 2s", "wrong answer"]
    assert [is_timeout(r) for r in reasons] == [True, False, True, True, False, False]
    assert verify_metric(reasons, "verify/timeouts") == 3.0


def test_math_batch_continues_after_a_timeout(math_verifier):
    pairs = [(r"\boxed{1}", "1"), (HANG, "1"), (r"\boxed{3}", "4"), (r"\boxed{0.25}", "1/4")]
    verdicts = math_verifier.verify_batch(pairs)
    assert [v.reason for v in verdicts] == ["correct", "timeout after 0.5s", "wrong answer", "correct"]


def test_math_recovers_from_a_dead_child(math_verifier):
    worker = math_verifier._worker
    assert worker is not None
    worker.process.kill()
    worker.process.join(5)
    assert math_verifier.verify(r"\boxed{5}", "5").reward == 1.0


def _kill_children(verifier: MathVerifier, count: int, after_s: float = 0.5) -> threading.Thread:
    """A thread that SIGKILLs ``count`` of the verifier's children in turn, each ``after_s``
    after it said it is ready (so each dies while judging)."""
    def kill() -> None:
        killed: set[int] = set()
        deadline = time.monotonic() + 30
        while len(killed) < count and time.monotonic() < deadline:
            worker = verifier._worker
            if worker is not None and worker.ready and worker.process.pid not in killed:
                time.sleep(after_s)
                killed.add(worker.process.pid)
                worker.process.kill()
            time.sleep(0.01)
    thread = threading.Thread(target=kill)
    thread.start()
    return thread


def test_math_child_killed_mid_answer_judges_the_answer_again():
    """A child SIGKILLed from outside while judging: the answer goes to a new child (here it
    hangs again, and gets the timeout it gets without the kill), not "verifier crashed"."""
    with MathVerifier(timeout_s=2) as verifier:
        verifier.verify(r"\boxed{1/2}", "0.5")
        killer = _kill_children(verifier, 1)
        verdicts = verifier.verify_batch([(HANG, "1"), (r"\boxed{1/2}", "0.5")])
        killer.join()
    assert verdicts == [Verdict(0.0, "timeout after 2s"), Verdict(1.0, "correct")]


def test_math_answer_that_every_child_dies_on_is_a_crash_not_an_exception():
    with MathVerifier(timeout_s=60) as verifier:
        verifier.verify(r"\boxed{1/2}", "0.5")
        killer = _kill_children(verifier, 1 + verifier.crash_retries)
        verdicts = verifier.verify_batch([(HANG, "1"), (r"\boxed{2}", "2")])
        killer.join()
    assert verdicts == [Verdict(0.0, "verifier crashed"), Verdict(1.0, "correct")]


def test_math_child_killed_during_its_start_up_is_started_again():
    with MathVerifier(timeout_s=2) as verifier:
        verifier._restart()
        verifier._worker.process.kill()  # before it said it is ready
        assert verifier.verify(r"\boxed{1/2}", "0.5") == Verdict(1.0, "correct")


def test_math_works_off_the_main_thread(math_verifier):
    # math-verify's own signal-based timeouts raise here; ours does not use signals.
    out: list[Verdict] = []
    thread = threading.Thread(target=lambda: out.append(math_verifier.verify(r"\boxed{4}", "4")))
    thread.start()
    thread.join(30)
    assert out == [Verdict(1.0, "correct")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_child_exits_when_its_parent_is_killed(tmp_path):
    # A SIGKILLed Ray actor must not leave a child spinning on 9^9^9^9 forever.
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(f"""
        import sys, threading
        from workers.verify.math_verifier import MathVerifier
        if __name__ == "__main__":
            v = MathVerifier(timeout_s=600)
            v.verify(r"\\boxed{{1/2}}", "0.5")  # not an integer: the child starts
            print(v._worker.process.pid, flush=True)
            threading.Thread(target=v.verify, args=({HANG!r}, "1"), daemon=True).start()
            sys.stdin.read()
    """))
    parent = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        time.sleep(0.5)  # let the child get into the hanging comparison
        assert _alive(child_pid)
    finally:
        parent.kill()
        parent.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child_pid):
        time.sleep(0.1)
    try:
        assert not _alive(child_pid)
    finally:
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs; an exited orphan may linger as a zombie if nobody reaps it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
