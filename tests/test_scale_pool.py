"""The scale backends together in a run, on CPU: a mixed pool (llama-char on vLLM + DeepSpeed
ZeRO-2, gpt2-bpe on hf + torch) trains with GRAFT end to end, and survives a dead vLLM replica
and a dead DeepSpeed rank, ending equal to the uninterrupted run. Needs ``.venv-scale`` (``make
test-scale``), like ``tests/test_scale_backends.py``; elsewhere it skips."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.config import load_config
from tests.scale_setup import HAS_DEEPSPEED, HAS_VLLM, MIXED

needs_both = pytest.mark.skipif(not (HAS_VLLM and HAS_DEEPSPEED),
                                reason="needs vllm and deepspeed: run `make test-scale` (.venv-scale)")
pytestmark = [pytest.mark.slow, needs_both]


# -- a mixed pool, end to end -----------------------------------------------------------------

MIXED_STEPS, MIXED_PROMPTS = 3, 16


def _mixed_config(out: Path, name: str):
    return load_config(MIXED, [f"run.steps={MIXED_STEPS}", "run.eval_every=3", f"algorithm.prompt_batch={MIXED_PROMPTS}",
                               "eval.max_prompts=4", "eval.samples=2", "run.checkpoint_every=1",
                               f"run.output_dir={out}", f"run.name={name}"])


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory, ray_local) -> Path:
    from orchestrator.controller.loop import Controller

    out = tmp_path_factory.mktemp("mixed")
    Controller(_mixed_config(out, "ref")).run()
    return out / "ref"


def test_mixed_pool_runs_a_graft_exchange_end_to_end(mixed_run):
    """llama-char on vLLM + DeepSpeed, gpt2-bpe on hf + torch: the store obeys Eq. 4 and the
    gate, groups cross between the backends, and the run checkpoints through DeepSpeed."""
    import json

    from tests.platform_checks import check_store, read_store

    config = load_config(mixed_run / "config.yaml")
    assert (config.models[0].generation.backend, config.models[0].trainer.backend) == ("vllm", "deepspeed")
    assert config.models[0].generation.weight_sync == "collective"  # DeepSpeed -> vLLM over gloo
    assert (config.models[1].generation.backend, config.models[1].trainer.backend) == ("hf", "torch")
    names = [m.name for m in config.models]
    rows = read_store(mixed_run)
    grafted = check_store(rows, n=config.algorithm.n, delta=config.exchange.delta,
                          steps=MIXED_STEPS, prompts=MIXED_PROMPTS, models=names)
    # the vLLM replica sampled step s with the weights broadcast after step s-1
    assert {(r["step"], r["policy_version"]) for r in rows if r["model"] == names[0] and r["kind"] == "own"} == {
        (s, s - 1) for s in range(1, MIXED_STEPS + 1)}
    summary = json.loads((mixed_run / "summary.json").read_text())
    received = {name: summary["models"][name]["exchange"]["received"] for name in names}
    assert received["llama-char-vllm"] > 0 and received["gpt2-bpe"] > 0, received  # both directions
    assert sum(received.values()) == grafted
    assert (mixed_run / "checkpoints" / f"step_{MIXED_STEPS:06d}" / "llama-char-vllm" / "deepspeed").is_dir()
    assert (mixed_run / "final" / "llama-char-vllm" / "model.safetensors").is_file()


def test_mixed_pool_survives_a_dead_vllm_replica_and_deepspeed_rank(mixed_run, tmp_path):
    """Issue 6's guarantees with the scale backends: the vLLM replica killed as step 2 starts
    and the DeepSpeed rank killed during step 3's update are restarted (the rank from the
    DeepSpeed checkpoint of step 2), and the run ends equal to the uninterrupted one."""
    from tests.test_faults import FaultyController, assert_same_run

    controller = FaultyController(_mixed_config(tmp_path, "faults"),
                                  {2: lambda c: c.actors["llama-char-vllm"].generators[0]},
                                  train_kill=("llama-char-vllm", 0, 3))
    controller.run()
    assert [f["kind"] for f in controller.state.faults] == ["generator", "trainer"]
    assert_same_run(tmp_path / "faults", mixed_run)
