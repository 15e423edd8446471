"""``benchmarks.learning_report``'s recovery check samples the final model on prompts rendered as
the run's rollouts rendered them (issue #51's thirty-second read).

``train_pool_recovery`` built its sampler with ``HFGeneration``'s defaults, so a model whose run set
``models[].chat_template: none`` (a plain prompt, stopped at EOS) was asked its first-seen all-fail
prompts through its tokenizer's chat template: the recovery figure measured another prompt than the
one it reports on. A real Llama-3.2-base-shaped final model (a chat template in its tokenizer), the
run's config with ``chat_template: none``, a real plugin verifier that takes exactly the response the
plain prompt gets (same seed) for a solve."""

from __future__ import annotations

import textwrap

import yaml


def test_the_recovery_check_renders_prompts_as_the_run_did(tmp_path):
    import torch

    from benchmarks.learning_report import train_pool_recovery
    from orchestrator.config import load_config
    from orchestrator.controller.prompts import load_data
    from tests.llama3_style import build_llama32_base
    from tests.shared_runs import plugin_run_folder
    from workers.rollout.generation import HFGeneration, SamplingParams

    plugin = tmp_path / "exact_plugin.py"
    plugin.write_text("def exact(question, response, answer, metadata):\n    return 0.0\n")
    run_dir, model, prompt_id = plugin_run_folder(tmp_path, plugin, "exact", [0.0, 0.0])
    final = run_dir / "final" / model
    final.unlink()
    build_llama32_base(final)
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["models"][0].update(chat_template="none", generation={"max_new_tokens": 8})
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))

    loaded = load_config(run_dir / "config.yaml")
    problem = next(p for p in load_data(loaded.data.train, [], loaded.run.seed)[0] if p.prompt_id == prompt_id)
    gen = loaded.models[0].generation
    torch.manual_seed(0)  # as train_pool_recovery(seed=0) draws
    plain = HFGeneration(final, chat_template="none").generate(
        [problem.prompt], SamplingParams(1, gen.temperature, gen.top_p, gen.max_new_tokens))[0].responses[0]
    torch.manual_seed(0)
    templated = HFGeneration(final).generate(
        [problem.prompt], SamplingParams(1, gen.temperature, gen.top_p, gen.max_new_tokens))[0].responses[0]
    assert plain != templated  # the two renderings are told apart by the sample
    plugin.write_text(textwrap.dedent(f'''
        def exact(question, response, answer, metadata):
            return 1.0 if response == {plain!r} else 0.0
    '''))

    result = train_pool_recovery(run_dir, model, samples=1)
    assert result["first_all_fail"] == 1.0
    assert result["recovery"] == 1.0  # before: 0.0, the templated prompt's sample
