"""``data.max_response_chars``: long chains of thought keep their reward.

The verifiers once refused (reward 0, "too long") every response over 10,000 characters, with no
config field, so a model generating up to ``max_new_tokens: 4096`` BPE tokens lost its correct
answers. Now the cap is a config field whose default no generated response reaches, the
boxed-answer verifiers judge a longer response's tail, and capped responses are counted
(``verify/capped``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from orchestrator.controller.step_metrics import model_metrics
from workers.training.train_result import TrainResult
from workers.verify.math_verifier import MathVerifier
from workers.verify.plugin_verifier import PluginVerifier
from workers.verify.verifier import ExactVerifier

CAPPED = "(capped: "  # in the reason of a response over the cap (workers.verify.verifier.is_capped)


def is_capped(reason: str) -> bool:
    return CAPPED in reason

ROOT = Path(__file__).resolve().parents[1]
# a long chain of thought (26,000 characters, about 4,000 BPE tokens of prose) and a final answer
THOUGHT = "Let me think about this step by step; 6 times 7 is 42. " * 480
LONG = THOUGHT + r"So the answer is \boxed{42}."


def _config(**data):
    models = [{"name": "a", "builder": {"arch": "llama", "tokenizer": "char", "max_positions": 8192},
               "generation": {"max_new_tokens": 4096}},
              {"name": "b", "builder": {"arch": "gpt2", "tokenizer": "bpe", "max_positions": 1024},
               "generation": {"max_new_tokens": 512}}]
    return load_config(data={"models": models, "data": data})


def test_the_field_is_validated_and_its_default_derived_from_max_new_tokens():
    from orchestrator.config.data_section import CHARS_PER_TOKEN
    from workers.verify.verifier import is_capped as verifiers_is_capped

    assert verifiers_is_capped("correct (capped: judged the last 1 of 2 chars)")
    assert len(LONG) > 10_000
    for bad in (0, -5):
        with pytest.raises(ConfigError, match=r"data\.max_response_chars: Input should be greater than 0"):
            _config(max_response_chars=bad)
    config = _config()
    assert config.data.max_response_chars is None
    assert config.response_chars == 4096 * CHARS_PER_TOKEN  # the pool's largest max_new_tokens
    assert config.response_chars > 4096 * 32
    assert _config(max_response_chars=5000).response_chars == 5000


def _own(reasons: list[str]) -> StepRecord:
    n = len(reasons)
    return StepRecord({"prompt_id": ["p"] * n, "reward": [1.0] * n, "reason": reasons,
                       "token_ids": [[1, 2]] * n, "kind": ["own"] * n, "group": [0] * n,
                       "advantage": [0.0] * n})


def verify_metric(reasons: list[str], key: str) -> float:
    """The step metric ``key`` of one model whose responses got ``reasons`` (``model_metrics``,
    what the controller logs)."""
    own = _own(reasons)
    metrics, _ = model_metrics(0, "a", own, own, TrainResult({}, 1, {}), np.zeros((1, 1)), ["a"], len(reasons), {})
    return metrics[key]


def _capped_metric(reasons: list[str]) -> float:
    return verify_metric(reasons, "verify/capped")


@pytest.mark.parametrize("verifier", ["math", "exact"])
def test_a_long_chain_of_thought_scores_through_the_runs_verifier_actors(ray_local, verifier):
    """Built as a run builds them (``Controller.verifier_pool`` from the config); fast path off,
    so every answer is judged in a verifier actor."""
    from orchestrator.controller.loop import Controller

    answers = [(LONG, "42"), (THOUGHT + r"\boxed{41}", "42")]
    pool = Controller(_config(verifier=verifier, verifier_actors=1, fast_path=False)).verifier_pool()
    try:
        verdicts = pool.verify_batch(answers)
    finally:
        pool.shutdown()
    assert [(v.reward, v.reason) for v in verdicts] == [(1.0, "correct"), (0.0, "wrong answer")]
    assert _capped_metric([v.reason for v in verdicts]) == 0.0

    # over a configured cap: judged on its tail, where the final box is, and counted
    pool = Controller(_config(verifier=verifier, verifier_actors=1, fast_path=False,
                              max_response_chars=1000)).verifier_pool()
    try:
        verdicts = pool.verify_batch([*answers, (r"\boxed{42}", "42")])
    finally:
        pool.shutdown()
    assert [v.reward for v in verdicts] == [1.0, 0.0, 1.0]
    note = f" (capped: judged the last 1000 of {len(LONG)} chars)"
    assert verdicts[0].reason == "correct" + note
    assert [is_capped(v.reason) for v in verdicts] == [True, True, False]
    assert _capped_metric([v.reason for v in verdicts]) == 2.0


def test_a_reward_plugin_through_the_runs_verifier_actors_gets_long_responses_and_not_capped_ones():
    from orchestrator.controller.loop import Controller

    verifier = f"python:{ROOT / 'examples' / 'reward_plugin.py'}:length_penalised"
    pool = Controller(_config(verifier=verifier, verifier_actors=1)).verifier_pool()
    try:
        judged = pool.verify_batch([(LONG, "42")])[0]
    finally:
        pool.shutdown()
    assert (judged.reward, judged.reason) == (0.6, f"correct, {len(LONG) - 40} chars over budget")
    pool = Controller(_config(verifier=verifier, verifier_actors=1, max_response_chars=1000)).verifier_pool()
    try:
        refused = pool.verify_batch([(LONG, "42")])[0]
    finally:
        pool.shutdown()
    assert (refused.reward, refused.reason) == (0.0, f"too long (capped: {len(LONG)} chars > 1000)")
    assert _capped_metric([judged.reason, refused.reason]) == 1.0


def test_the_tail_keeps_the_whole_responses_verdict_unless_the_final_box_is_cut():
    exact = ExactVerifier(max_chars=100)
    assert exact.verify("x" * 500 + r"\boxed{12}", "12").reason == "correct (capped: judged the last 100 of 510 chars)"
    # a draft box early on is no answer: only the box that opens last counts, as without a cap
    assert exact.verify(r"\boxed{12}" + "x" * 500, "12").reason == \
        "no \\boxed{} answer (capped: judged the last 100 of 510 chars)"
    # a final box that opens before the tail is lost, never replaced by something else
    assert exact.verify(r"\boxed{" + "1" * 200 + "}", "1" * 200).reward == 0.0
    # the driver's fast path settles a capped answer with the verdict math-verify gives it
    settled = MathVerifier(max_chars=1000).settle(LONG, "42")
    with MathVerifier(max_chars=1000, settle_integers=False) as slow:
        assert slow.settle(LONG, "42") is None
        assert settled == slow.verify(LONG, "42") == slow.verify_batch([(LONG, "42")])[0]
    assert settled is not None and settled.reward == 1.0 and is_capped(settled.reason)


def test_a_reward_plugin_judges_long_responses_and_refuses_those_over_the_cap():
    target = f"{ROOT / 'examples' / 'reward_plugin.py'}:length_penalised"
    with PluginVerifier(target, max_chars=len(LONG)) as plugin:
        judged = plugin.verify(LONG, "42")
        assert judged.reward > 0.0 and not is_capped(judged.reason)  # 10,000 chars once refused it
    with PluginVerifier(target, max_chars=1000) as plugin:
        refused = plugin.verify(LONG, "42")
    assert refused.reward == 0.0 and refused.reason == f"too long (capped: {len(LONG)} chars > 1000)"
    assert is_capped(refused.reason)
