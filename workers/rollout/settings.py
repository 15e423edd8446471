"""What a generation replica is told when it starts: one typed, frozen record per replica.

``orchestrator.cluster.model_actors`` builds a :class:`GenerationSettings` from a model's
``models[]`` and ``models[].generation`` sections (as :class:`workers.training.settings.TrainerSettings`
for the trainer ranks); the generation worker hands it to its backend's factory
(``workers.rollout.generation.BACKENDS``). A setting that is not a field is an error naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from workers.model_files import ModelSource


@dataclass(frozen=True)
class VLLMEngine:
    """``models[].generation.vllm``: the ``vllm`` backend's engine (ignored by ``hf``)."""

    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.15
    kv_cache_space_gb: float = 1.0
    dtype: str = "auto"
    max_model_len: int | None = None
    enforce_eager: bool = True
    sleep: bool = False


@dataclass(frozen=True)
class GenerationSettings:
    """Every setting of one generation replica."""

    backend: str = "hf"  # a name in workers.rollout.generation.BACKENDS
    path: str | ModelSource = ""  # the model folder or hub id (workers.model_files: perhaps shipped)
    seed: int = 0  # the replica's sampling seed
    num_threads: int = 1  # torch threads
    nice: int = 0  # the process's CPU niceness, 0-19 (workers.rollout.cpu_priority); 0: left as it is
    trust_remote_code: bool = False
    chat_template: str = "auto"
    pad_token: str | None = None  # models[].pad_token (None: the tokenizer's own, else its EOS)
    lora: dict[str, Any] | None = None  # models[].lora plus the model's init_seed (workers.training.lora)
    # hf: sequences per generate call, the weights' dtype and device
    batch_size: int = 256
    dtype: str = "auto"
    device: str = "cpu"
    vllm: VLLMEngine = VLLMEngine()

    def with_changes(self, **changes: Any) -> GenerationSettings:
        """A copy with ``changes`` applied; a name that is not a setting raises ``TypeError``."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown generation setting(s) {', '.join(unknown)}; "
                            f"the settings are: {', '.join(sorted(known))}")
        return replace(self, **changes)
