"""``graftpool eval RUN_DIR --endpoint URL`` judges the served answers with the run's verifier as
the run configured it: ``data.verifier_timeout_s`` too (the GPU template's 5 s), not the
verifier's 2 s default, so an answer the run's evaluation scores is not a timeout here.

The endpoint is a plain OpenAI-compatible HTTP server on 127.0.0.1 that answers every chat
request with one fixed response (``evaluate_endpoint`` speaks to any such server); the verifier
is a real reward plugin in its child process, spending 3 s of CPU time on each answer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from orchestrator.serving.endpoint_eval import evaluate_endpoint
from tests.chat_endpoint import boxed_choices, chat_endpoint

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = textwrap.dedent('''
    import time

    def spins(question, response, answer, metadata):
        start = time.process_time()
        while time.process_time() - start < 3.0:  # 3 s of the child's CPU time
            pass
        return 1.0
''')


@pytest.fixture
def endpoint():
    """Every chat request answered with one fixed response: ``n`` choices, each the same boxed answer."""
    with chat_endpoint(lambda body: (200, boxed_choices(body))) as url:
        yield url


def test_endpoint_eval_gives_the_verifier_the_runs_timeout(endpoint, tmp_path):
    plugin = tmp_path / "spin_plugin.py"
    plugin.write_text(PLUGIN)
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["exchange"] = {"name": "none"}
    config["models"] = config["models"][:1]
    config["data"].update(eval=config["data"]["eval"][:1], verifier=f"python:{plugin}:spins", verifier_timeout_s=30.0)
    config["eval"] = {"samples": 1, "max_prompts": 1}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))

    scores = evaluate_endpoint(run_dir, endpoint)
    assert scores == {"llama-char": {"add": 1.0, "avg": 1.0}}  # under a 2 s limit: 0.0, a timeout
    assert json.loads((run_dir / "eval_endpoint.json").read_text())["scores"] == scores


def test_the_learning_reports_recovery_check_gives_the_verifier_the_runs_timeout(tmp_path):
    """``benchmarks.learning_report.train_pool_recovery`` scores a run's final model with the run's
    verifier as configured (``config.verifier_params``): the 30 s limit, not the 2 s default, so
    the plugin's 3 s answer counts (before: its timeout left ``data.verifier_timeout_s`` out).
    A real final model (the demo's llama-char), a store with one all-fail prompt, one sample."""
    from benchmarks.learning_report import train_pool_recovery
    from tests.shared_runs import plugin_run_folder

    plugin = tmp_path / "spin_plugin.py"
    plugin.write_text(PLUGIN)
    run_dir, model, _ = plugin_run_folder(tmp_path, plugin, "spins", [0.0, 0.0], verifier_timeout_s=30.0)

    result = train_pool_recovery(run_dir, model, samples=1)
    assert result["first_all_fail"] == 1.0
    assert result["recovery"] == 1.0  # under a 2 s limit: 0.0, a timeout
