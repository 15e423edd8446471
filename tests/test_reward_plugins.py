"""Reward-function plugins (``data.verifier: python:...``, workers/verify/plugin_verifier.py): good
ones are called with (question, response, answer, metadata) in a child of the verifier
actor; one that raises, hangs (computing or waiting), returns NaN, 7 or text scores 0 with a
reason naming it, and the verifier goes on. A short pair run takes its rewards from the example plugin."""

from __future__ import annotations

import json
import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from graftpool.contracts import ExchangeInput
from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.step_metrics import group_successes
from workers.verify.cpu_limit import WALL_FACTOR
from workers.verify.plugin_verifier import PluginVerifier, absolute_verifier, split_target
from workers.verify.verifier import Query, Verdict, is_plugin_failure, make_verifier, verify_many

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "reward_plugin.py"
TIMEOUT_S = 0.5

PLUGINS = textwrap.dedent('''
    import math, time

    def good(question, response, answer, metadata):
        return (1.0 if response.strip() == answer else 0.25), f"{question}|{metadata.get('task')}"

    def bare(question, response, answer, metadata):
        return 0.75

    def raises(question, response, answer, metadata):
        raise RuntimeError("boom")

    def hangs(question, response, answer, metadata):
        while True:  # computes for ever: stopped by the limit on the child's CPU time
            pass

    def sleeps(question, response, answer, metadata):
        while True:  # waits for ever, using no CPU: stopped by the wall-clock backstop
            time.sleep(0.05)

    def nan(question, response, answer, metadata):
        return math.nan

    def seven(question, response, answer, metadata):
        return 7

    def text(question, response, answer, metadata):
        return "high"

    def exits(question, response, answer, metadata):
        raise SystemExit(3)

    not_a_function = 3
''')


@pytest.fixture(scope="module")
def plugin_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugins") / "plugins.py"
    path.write_text(PLUGINS)
    return path


def _verifier(plugin_file: Path, function: str) -> PluginVerifier:
    verifier = make_verifier(f"python:{plugin_file}:{function}", timeout_s=TIMEOUT_S)
    assert isinstance(verifier, PluginVerifier)
    return verifier


def test_good_plugin_gets_question_metadata_and_its_reward(plugin_file):
    with _verifier(plugin_file, "good") as verifier:
        verdicts = verify_many(verifier, [Query("4", "4", "2+2=", {"task": "add"}),
                                          Query("5", "4", "2+2=", {"task": "add"}),
                                          ("4", "4")])  # a bare pair: no question, no metadata
        assert verdicts == [Verdict(1.0, "2+2=|add"), Verdict(0.25, "2+2=|add"), Verdict(1.0, "|None")]
        assert not verifier.failures
    with _verifier(plugin_file, "bare") as verifier:
        assert verifier.verify("x", "y") == Verdict(0.75, "reward 0.75")
        assert verifier.verify("x", "y").correct  # a success: reward > 0.5


@pytest.mark.parametrize(("function", "what"), [
    ("raises", "raised RuntimeError: boom"),
    ("hangs", f"timeout after {TIMEOUT_S:g}s"),
    ("sleeps", f"timeout after {WALL_FACTOR * TIMEOUT_S:g}s wall clock"),
    ("nan", "returned nan (not in [0, 1])"),
    ("seven", "returned 7.0 (not in [0, 1])"),
    ("text", "returned 'high' (not a number)"),
    ("exits", "raised SystemExit: 3"),
])
def test_a_failing_plugin_scores_zero_with_a_reason_naming_it_and_the_verifier_goes_on(plugin_file, function, what):
    with _verifier(plugin_file, function) as verifier:
        start = time.monotonic()
        verdicts = verifier.verify_batch([Query("a", "a", "q"), Query("b", "b", "q")])
        elapsed = time.monotonic() - start
        expected = Verdict(0.0, f"plugin plugins.py:{function} failed: {what}")
        assert verdicts == [expected, expected]
        assert is_plugin_failure(expected.reason)
        assert sum(verifier.failures.values()) == 2
        if function == "hangs":  # each answer killed after the timeout, the child restarted
            assert elapsed < 2 * TIMEOUT_S + 10
        # the verifier goes on: the same one still judges (and still fails the same way)
        assert verifier.verify("c", "c") == expected


def test_a_hanging_plugin_child_is_killed_and_replaced(plugin_file):
    with _verifier(plugin_file, "hangs") as verifier:
        verifier.verify("a", "a")
        first = verifier._worker
        verifier.verify("b", "b")
        assert first is not None and not first.process.is_alive()
        assert verifier._worker is not first


def test_targets_are_checked_before_a_run(plugin_file, tmp_path):
    base = {"models": [{"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}}],
            "exchange": {"name": "none"}}
    config = load_config(data={**base, "data": {"verifier": f"python:{plugin_file}:good"}})
    assert config.data.verifier == f"python:{plugin_file}:good"
    relative = os.path.relpath(EXAMPLE)
    config = load_config(data={**base, "data": {"verifier": f"python:{relative}:length_penalised"}})
    assert config.data.verifier == f"python:{relative}:length_penalised"  # as written: config.yaml's
    assert absolute_verifier(config.data.verifier) == f"python:{EXAMPLE}:length_penalised"  # the actors'
    assert absolute_verifier("python:json:loads") == "python:json:loads" and absolute_verifier("math") == "math"
    assert load_config(data={**base, "data": {"verifier": "python:json:loads"}}).data.verifier == "python:json:loads"
    for bad, message in [("sympy", "expected one of ['exact', 'math', 'reasoning_gym'] or python:"),
                         ("python:nofunction", "expected python:package.module:function"),
                         (f"python:{tmp_path}/missing.py:f", "no file"),
                         ("python:no_such_module_xyz:f", "no module 'no_such_module_xyz'")]:
        with pytest.raises(ConfigError, match="data.verifier") as err:
            load_config(data={**base, "data": {"verifier": bad}})
        assert message in str(err.value)
    assert split_target("a.b:c") == ("a.b", "c") and split_target("/x/y.py:f") == ("/x/y.py", "f")


@pytest.mark.parametrize(("function", "why"), [("missing", "has no 'missing'"),
                                               ("not_a_function", "is not callable")])
def test_a_plugin_that_does_not_load_fails_its_check(plugin_file, function, why):
    verifier = _verifier(plugin_file, function)
    with pytest.raises(ValueError, match=f"reward plugin python:.*plugins.py:{function}: start-up failed: .*{why}"):
        verifier.check()
    # and if judged anyway, every answer scores 0 with the reason, nothing raises
    verdict = verifier.verify("a", "a")
    assert verdict.reward == 0.0 and verdict.reason.startswith(f"plugin plugins.py:{function} failed: verifier unavailable")
    verifier.close()


def test_the_example_plugin():
    from examples.reward_plugin import length_penalised

    assert length_penalised("2+2=", "2+2=4, \\boxed{4}", "4", {}) == (1.0, "correct")
    reward, reason = length_penalised("2+2=", "x" * 100 + "\\boxed{4}", "4", {})
    assert 0.6 <= reward < 1.0 and reason.startswith("correct, ")
    assert length_penalised("2+2=", "\\boxed{5}", "4", {}) == (0.0, "wrong answer")
    assert length_penalised("2+2=", "4", "4", {})[0] == 0.0


def test_success_is_a_reward_above_one_half():
    own = StepRecord({"prompt_id": ["p"] * 4, "reward": [0.9, 0.6, 0.5, 0.0]})
    assert group_successes(own) == {"p": 2}
    inp = ExchangeInput(models=["m"], prompt_ids=["p"], rewards=np.array([[[0.9, 0.6, 0.5, 0.0]]]))
    assert inp.k.tolist() == [[2]]
    with pytest.raises(ValueError):
        Verdict(1.5, "x")
    with pytest.raises(ValueError):
        Verdict(float("nan"), "x")


# ----------------------------------------------------------------------------- a pair run


@pytest.mark.slow
def test_a_pair_run_takes_its_rewards_from_the_plugin(tmp_path, ray_local):
    import pyarrow.dataset as ds

    from orchestrator.controller.loop import train
    from orchestrator.controller.prompts import load_data

    calls = tmp_path / "calls.jsonl"
    wrapper = tmp_path / "counting_plugin.py"
    wrapper.write_text(textwrap.dedent(f'''
        import json, os, runpy
        length_penalised_ = runpy.run_path({str(EXAMPLE)!r})["length_penalised"]

        def length_penalised(question, response, answer, metadata):
            with open({str(calls)!r}, "a") as f:
                f.write(json.dumps({{"pid": os.getpid(), "ppid": os.getppid(), "task": metadata["task"]}}) + "\\n")
            return length_penalised_(question, response, answer, metadata)
    '''))
    config = load_config(ROOT / "configs" / "demo_pair.yaml", [
        "run.steps=1", "algorithm.prompt_batch=8", "run.eval_every=0", "data.eval=[]",
        f"run.output_dir={tmp_path}", "run.name=plugin", f"data.verifier=python:{wrapper}:length_penalised"])
    train(config)

    from examples.reward_plugin import length_penalised

    rows = ds.dataset(str(tmp_path / "plugin" / "trajectories"), format="parquet").to_table().to_pylist()
    own = [r for r in rows if r["kind"] == "own"]
    assert len(own) == 1 * 8 * config.algorithm.n * 2  # steps x prompts x n x models
    problems = {p.prompt_id: p for p in load_data(config.data.train, [])[0]}
    for row in own:
        problem = problems[row["prompt_id"]]
        reward, reason = length_penalised(problem.question, row["response"], problem.answer, {})
        assert (row["reward"], row["reason"]) == (pytest.approx(reward), reason)
    # every answer went to the plugin (no fast path), in children of the verifier actors
    called = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(called) == len(own)
    assert {c["task"] for c in called} <= set(config.data.train.tasks)
    assert os.getpid() not in {c["pid"] for c in called} | {c["ppid"] for c in called}
    assert len({c["ppid"] for c in called}) <= config.data.verifier_actors
    records = [json.loads(line) for line in (tmp_path / "plugin" / "metrics.jsonl").read_text().splitlines()]
    failures = [r["metrics"]["train/plugin_failures"] for r in records
                if r.get("model") and "train/plugin_failures" in r.get("metrics", {})]
    assert failures == [0.0] * 2  # steps x models
