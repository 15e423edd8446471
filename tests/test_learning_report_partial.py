"""``benchmarks.learning_report``'s all-fail prompts and their recovery count successes (reward
above ``graftpool.contracts.SUCCESS_THRESHOLD``, the exchange's rule), not reward values: a reward
plugin (or reasoning-gym) that gives a wrong answer a partial reward of 0.2 leaves a prompt all-fail.

Before, ``first_seen_all_fail`` summed the rewards (0.2 + 0.2 is no all-fail) and
``train_pool_recovery`` took any reward above 0 for a solve, so a run whose model never solved a
prompt reported it as never failed, or as recovered. A real final model (the demo's llama-char),
a real plugin verifier in its child process, one prompt, one sample."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = textwrap.dedent('''
    def partial(question, response, answer, metadata):
        return 0.2  # every answer wrong, with a partial reward
''')


def test_a_partial_reward_is_a_failure_to_the_learning_reports_recovery_check(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.learning_report import first_seen_all_fail, train_pool_recovery
    from orchestrator.config import load_config
    from orchestrator.controller.prompts import load_data
    from orchestrator.models import resolve_model_path

    plugin = tmp_path / "partial_plugin.py"
    plugin.write_text(PLUGIN)
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["exchange"] = {"name": "none"}
    config["models"] = config["models"][:1]
    config["data"].update(verifier=f"python:{plugin}:partial")
    run_dir = tmp_path / "run"
    (run_dir / "trajectories").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    loaded = load_config(run_dir / "config.yaml")
    model = loaded.models[0]
    (run_dir / "final").mkdir()
    (run_dir / "final" / model.name).symlink_to(Path(resolve_model_path(model)).resolve())
    prompt_id = load_data(loaded.data.train, [], loaded.run.seed)[0][0].prompt_id
    pq.write_table(pa.table({"step": [1, 1], "model": [model.name] * 2, "prompt_id": [prompt_id] * 2,
                             "kind": ["own"] * 2, "reward": [0.2, 0.2]}), run_dir / "trajectories" / "step.parquet")

    assert first_seen_all_fail(run_dir, model.name) == [prompt_id]  # before: [] (0.2 + 0.2 is not 0)
    result = train_pool_recovery(run_dir, model.name, samples=1)
    assert result["first_all_fail"] == 1.0
    assert result["recovery"] == 0.0  # the plugin's 0.2 is no solve
