"""pass@1 with a reward plugin's fractional rewards counts successes, not reward values.

README's own-data snippet names a reward plugin (``examples/reward_plugin.py``: a right answer
scores 1.0 down to 0.6 for a long one). The project counts a response as a success when its
reward is above 0.5 (``graftpool.contracts.SUCCESS_THRESHOLD``: k, all-fail groups, donors),
but every logged ``eval/<set>/pass_at_1`` (and ``summary.json``'s, ``graftpool eval``'s) was
the mean reward: a model right on every sample at 0.6 had "pass@1" 0.6 (issue #51's thirtieth
read). Now pass@1 is the share of samples that are successes; reward means stay real-valued.

A real one-step run of one demo model whose plugin gives every answer 0.6."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.config import load_config
from orchestrator.controller.loop import Controller

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = '''def score(question, response, answer, metadata):
    return 0.6, "right, but long"
'''


def test_pass_at_1_counts_a_fractional_reward_above_the_threshold_as_a_pass(
        ray_local, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "sixty.py").write_text(PLUGIN)
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["eval"] = config["data"]["eval"][:2]
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    sets = ["run.name=sixty", f"run.output_dir={tmp_path / 'runs'}", "run.steps=1", "run.eval_every=1",
            "algorithm.prompt_batch=4", "eval.max_prompts=4", "eval.samples=2", "data.verifier_actors=1",
            "tracking.views=false", "data.verifier=python:sixty.py:score"]
    summary = Controller(load_config("one.yaml", sets)).run()
    run_dir = tmp_path / "runs" / "sixty"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    model = config["models"][0]["name"]
    train = next(m["metrics"] for m in metrics if m.get("model") == model and "train/reward_mean" in m["metrics"])
    assert train["train/reward_mean"] == pytest.approx(0.6), "reward means stay the real-valued rewards"
    final = summary["models"][model]["final_pass@1"]
    assert final == {"add": 1.0, "sub": 1.0, "avg": 1.0}, final
    logged = next(m["metrics"] for m in metrics if m.get("model") == model and "eval/avg/pass_at_1" in m["metrics"])
    assert logged["eval/avg/pass_at_1"] == 1.0
