"""``benchmarks.learning_report``'s all-fail prompts and their recovery count successes (reward
above ``graftpool.contracts.SUCCESS_THRESHOLD``, the exchange's rule), not reward values: a reward
plugin (or reasoning-gym) that gives a wrong answer a partial reward of 0.2 leaves a prompt all-fail.

Before, ``first_seen_all_fail`` summed the rewards (0.2 + 0.2 is no all-fail) and
``train_pool_recovery`` took any reward above 0 for a solve, so a run whose model never solved a
prompt reported it as never failed, or as recovered. A real final model (the demo's llama-char),
a real plugin verifier in its child process, one prompt, one sample."""

from __future__ import annotations

import textwrap

PLUGIN = textwrap.dedent('''
    def partial(question, response, answer, metadata):
        return 0.2  # every answer wrong, with a partial reward
''')


def test_a_partial_reward_is_a_failure_to_the_learning_reports_recovery_check(tmp_path):
    from benchmarks.learning_report import first_seen_all_fail, train_pool_recovery
    from tests.shared_runs import plugin_run_folder

    plugin = tmp_path / "partial_plugin.py"
    plugin.write_text(PLUGIN)
    run_dir, model, prompt_id = plugin_run_folder(tmp_path, plugin, "partial", [0.2, 0.2])

    assert first_seen_all_fail(run_dir, model) == [prompt_id]  # before: [] (0.2 + 0.2 is not 0)
    result = train_pool_recovery(run_dir, model, samples=1)
    assert result["first_all_fail"] == 1.0
    assert result["recovery"] == 0.0  # the plugin's 0.2 is no solve
