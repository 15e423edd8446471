"""The ``hf`` backend's KV budget (``models[].generation.kv_cache_budget_gb``,
``workers.rollout.kv_budget``): a call whose rows' KV cache would not fit is sampled in
sub-batches that do, the cache reserved at any moment stays within the budget, and the outputs
are those of the unsplit call (greedy) or of a ``batch_size`` of the sub-batch's rows (sampled:
one RNG stream, drawn a step at a time over a call's rows)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from graftpool.tasks import generate_problems
from orchestrator.config import ConfigError, load_config
from workers.rollout.chat import encode_kwargs, render_prompt
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.rollout.kv_budget import (
    GIB,
    KVBudget,
    kv_bytes_per_position,
    plan_calls,
    position_bytes,
    resolve_budget,
)
from workers.rollout.kv_cache import GrowingLayer

PROMPTS = [p.prompt for p in generate_problems(["add", "sub"], 6, seed=4, split="train")]


def _row_bytes(generator: HFGeneration, max_new_tokens: int) -> int:
    """One row's reserved cache: (the longest prompt + max_new_tokens) x bytes per position."""
    tok = generator.tokenizer
    rendered = [render_prompt(tok, p, generator.chat_template) for p in PROMPTS]
    longest = max(len(ids) for ids in tok(rendered, **encode_kwargs(tok, generator.chat_template))["input_ids"])
    return (longest + max_new_tokens) * kv_bytes_per_position(generator.model.config, generator.model.dtype)


def _reserved(cache) -> int:
    """Bytes a cache's in-place layers hold in their buffers."""
    return sum(layer._key_buffer.nbytes + layer._value_buffer.nbytes for layer in cache.layers
               if isinstance(layer, GrowingLayer) and layer._key_buffer is not None)


def _generate_recording(generator: HFGeneration, params: SamplingParams, monkeypatch) -> tuple[list, list[int]]:
    """The completions and the bytes each ``generate`` call's cache reserved (observed: the real
    cache, kept to be measured)."""
    import workers.rollout.generation as generation

    caches = []
    real = generation.growing_cache

    def recorded(config, capacity):
        caches.append(real(config, capacity))
        return caches[-1]

    monkeypatch.setattr(generation, "growing_cache", recorded)
    torch.manual_seed(5)
    completions = generator.generate(PROMPTS, params)
    monkeypatch.setattr(generation, "growing_cache", real)
    return completions, [_reserved(cache) for cache in caches]


def _same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.responses == y.responses and x.finished == y.finished
        assert x.prompt == y.prompt
        for la, lb in zip(x.logprobs, y.logprobs, strict=True):
            np.testing.assert_allclose(la, lb, atol=1e-5)


@pytest.mark.parametrize(("n", "rows"), [(4, 8), (4, 2), (1, 2)])
def test_a_call_over_the_budget_is_split_within_it_and_samples_the_same_greedy_tokens(paths, n, rows, monkeypatch):
    """A budget of ``rows`` rows: the 6 prompts' 6 n rows are sampled ``rows`` at a time (whole
    prompts at n = 4, 8 rows; a prompt's samples in halves at n = 4, 2 rows; n = 1, a prompt
    longer than max_new_tokens); no cache reserves more than the budget, and the greedy outputs
    are the unsplit call's. Before the budget: one cache for all rows, 3-6 x the budget."""
    params = SamplingParams(n=n, temperature=0.0, max_new_tokens=12)
    unsplit = HFGeneration(paths["llama-char"])
    row = _row_bytes(unsplit, params.max_new_tokens)
    assert row > 2 * 12 * kv_bytes_per_position(unsplit.model.config, unsplit.model.dtype)  # prompt > new tokens
    budget = rows * row + row // 4
    split = HFGeneration(paths["llama-char"], kv_cache_budget_gb=budget / GIB)
    expected, whole = _generate_recording(unsplit, params, monkeypatch)
    got, parts = _generate_recording(split, params, monkeypatch)
    assert whole and max(whole) > budget  # unsplit: all 6 n rows in one cache
    assert max(parts) <= budget
    assert len(parts) == len(PROMPTS) * n // rows
    _same(got, expected)


def test_a_split_sampled_call_draws_what_a_batch_size_of_its_rows_draws(paths, monkeypatch, caplog):
    """Sampling at temperature 1: the split call (8 rows of a 24-row call) gives the tokens of the
    same seed with ``generation.batch_size`` 8, and each prompt its n samples; the split is said
    once, naming the model, the rows a sub-batch and the field."""
    params = SamplingParams(n=4, max_new_tokens=12)
    small_batches = HFGeneration(paths["llama-char"], batch_size=8)
    row = _row_bytes(small_batches, params.max_new_tokens)
    split = HFGeneration(paths["llama-char"], kv_cache_budget_gb=(8 * row + row // 4) / GIB)
    expected, _ = _generate_recording(small_batches, params, monkeypatch)
    got, parts = _generate_recording(split, params, monkeypatch)
    assert len(parts) == 3
    assert all(len(c.token_ids) == 4 for c in got)
    said = [r.getMessage() for r in caplog.records if r.name == "workers.rollout.kv_budget"]
    assert len(said) == 1 and said[0].startswith(f"{paths['llama-char'].name}: a generate call of 24 rows")
    assert "kv_cache_budget_gb" in said[0] and said[0].endswith("sub-batches of at most 8 rows")
    _same(got, expected)


def test_a_budget_short_of_one_row_fails_naming_the_field_and_what_one_row_needs(paths):
    generator = HFGeneration(paths["llama-char"], kv_cache_budget_gb=1e-7)
    need = _row_bytes(generator, 12) / GIB
    with pytest.raises(ValueError, match=rf"models\[\]\.generation\.kv_cache_budget_gb gives 107 bytes .*; one row .* "
                                         rf"needs {need:.6g} GiB: set it to at least that"):
        generator.generate(PROMPTS, SamplingParams(n=1, max_new_tokens=12))


def test_the_budget_is_validated_at_load_naming_the_field():
    """A number > 0 or auto, and the hf backend's only (vllm sizes its own KV cache)."""
    for value in ("0", "-1", "lots"):
        with pytest.raises(ConfigError, match=r"models.0.generation.kv_cache_budget_gb"):
            load_config("configs/demo_pair.yaml", overrides=[f"models.0.generation.kv_cache_budget_gb={value}"])
    with pytest.raises(ConfigError, match=r"kv_cache_budget_gb is the hf backend's"):
        load_config("configs/demo_pair.yaml", overrides=["models.0.generation.backend=vllm",
                                                         "models.0.generation.kv_cache_budget_gb=4"],
                    check_backends=False)
    config = load_config("configs/demo_pair.yaml", overrides=["models.0.generation.kv_cache_budget_gb=0.5"])
    assert config.models[0].generation.kv_cache_budget_gb == 0.5
    assert config.models[1].generation.kv_cache_budget_gb == "auto"


def test_a_replica_is_told_its_share_of_the_gpu_for_the_auto_budget():
    """``auto`` on a GPU takes the replica's share of it (min(num_gpus, 1)); on a CPU 0.9 of the host
    memory available (below)."""
    from orchestrator.cluster.model_actors import generation_settings
    from orchestrator.serving.serve import serving_settings

    config = load_config("configs/demo_pair.yaml", overrides=["models.0.generation.num_gpus=0.25"])
    assert generation_settings(config.models[0], "folder", 1, 0, None).gpu_share == 0.25
    assert serving_settings("folder", 0.5, vllm_installed=False).gpu_share == 0.5
    assert serving_settings("folder", 2.0, vllm_installed=False).gpu_share == 1.0
    assert resolve_budget("auto", torch.device("cpu")) is not None
    assert resolve_budget(0.5, torch.device("cpu")) == GIB // 2


def test_a_cpu_replicas_auto_budget_bounds_a_3b_models_call_at_the_gpu_templates_batch(paths):
    """A copied-back run of ``configs/gpu/graft_pair_3b.yaml`` evaluated on a laptop as
    operations.md says (``generation.backend=hf``, ``num_gpus=0``) keeps the template's
    ``batch_size`` 1,024 and 4,096 new tokens. ``auto`` on a CPU was no limit, so a Qwen2.5-3B
    replica in fp32 reserved 1,024 x (prompt + 4,096) x 90,112 bytes (about 400 GB) at its first
    call. Now the real replica's ``auto`` budget is 0.9 of the host memory available, and the
    template's eval call (500 prompts, n = 8) is planned in calls whose cache fits it."""
    from transformers import Qwen2Config

    replica = HFGeneration(paths["llama-char"])  # auto, on this CPU
    budget = replica.kv_budget.budget
    assert budget is not None, "auto on a CPU is no limit"
    assert 0 < budget <= os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")  # the host's memory
    qwen = Qwen2Config(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2)  # Qwen2.5-3B's shape (no weights)
    per_position = position_bytes(qwen, torch.float32)
    assert per_position == 36 * 2 * 2 * 128 * 4 + 2 * 16 * 128 * 4
    positions = 200 + 4096
    fit = KVBudget("qwen2.5-3b", budget, per_position).rows_fit(positions, 1024)
    calls = plan_calls(500, 8, 1024, fit)
    assert max((end - start) * n for start, end, n in calls) * positions * per_position <= budget


def test_auto_on_a_cpu_without_proc_or_sysconfs_free_pages_starts(monkeypatch, tmp_path):
    """Issue #51's thirty-fifth read: ``auto`` on a CPU read ``/proc/meminfo`` and else
    ``os.sysconf("SC_AVPHYS_PAGES")``, which macOS lacks (``ValueError``): an ``hf`` replica on a
    Mac (operations.md's laptop evaluation) failed at its start. macOS cannot run here, so its two
    missing sources are taken away (a missing ``/proc`` file, ``sysconf`` refusing the name): the
    budget comes from psutil where installed (it is in this environment), else no limit."""
    import builtins
    import sys

    from workers.rollout import kv_budget

    real_sysconf = os.sysconf

    def macos_sysconf(name):
        if name == "SC_AVPHYS_PAGES":
            raise ValueError("unrecognized configuration name")
        return real_sysconf(name)

    monkeypatch.setattr(kv_budget, "MEMINFO", str(tmp_path / "no-proc-meminfo"))
    monkeypatch.setattr(os, "sysconf", macos_sysconf)
    budget = kv_budget.resolve_budget("auto", torch.device("cpu"))
    assert budget is not None and budget > 0  # psutil's figure
    real_import = builtins.__import__

    def without_psutil(name, *args, **kwargs):
        if name == "psutil":
            raise ImportError("no psutil")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "psutil", raising=False)
    monkeypatch.setattr(builtins, "__import__", without_psutil)
    assert kv_budget.resolve_budget("auto", torch.device("cpu")) is None  # no limit, as before the fix
