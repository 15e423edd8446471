"""The ``vllm`` backend's settings on the GPU-cluster path, checked at load (no vLLM needed):
tensor parallelism is refused rather than left to hang."""

from __future__ import annotations

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
