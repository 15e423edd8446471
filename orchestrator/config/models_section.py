"""``models:``: each model's weights, generation backend, trainer and LoRA adapters.

The fields the actors read as configured are declared in the workers' section models, which
these extend with what only the driver reads: ``workers.rollout.settings`` (``ModelSection``,
``GenerationSection``, ``VLLMSettings``) and ``workers.training.settings`` (``TrainerSection``, with
``DeepSpeedSettings``).
A backend or precision name is checked against its registry (``workers.registries``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from graftpool.sections import Strict, registered
from orchestrator.config.base import SafeName
from orchestrator.config.weight_syncs import WEIGHT_SYNCS
from workers.hub import PACKAGE_PREFIX, check_hub_id, hub_id
from workers.registries import TRAINERS
from workers.rollout.settings import GenerationSection, ModelSection, VLLMSettings
from workers.training.settings import TrainerSection
from workers.zoo.packaged import locate
from workers.zoo.zoo_spec import ModelSpec

TrainerBackend = registered(TRAINERS)
"""``models[].trainer.backend``: a name in :data:`workers.registries.TRAINERS` (torch, deepspeed, a plugin's)."""


class GenerationConfig(GenerationSection):
    """``models[].generation``: the replicas' section (backend, batch_size, dtype: ``GenerationSection``)
    and what the driver reads."""

    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(16, ge=1)
    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0, ge=0)  # per replica
    num_threads: int = Field(0, ge=0)  # torch threads per replica; 0: auto (orchestrator.cluster.model_actors.threads_for)
    # the replicas' CPU niceness, 0-19 (workers.rollout.cpu_priority); None: auto, OVERLAP_NICE (10) with
    # run.async one_step and replicas and trainer on CPU, so the update goes first, else 0
    # (orchestrator.cluster.model_actors.generation_nice)
    nice: int | None = Field(None, ge=0, le=19)
    # trainer -> replicas after each step, a mode registered in orchestrator.cluster.weight_sync_modes:
    # object_store (rank 0's state dict through Ray's object store) | collective (rank 0 broadcasts
    # over a gloo / NCCL group, workers.rollout.weight_sync)
    weight_sync: registered(WEIGHT_SYNCS) = "object_store"  # type: ignore[valid-type]
    sync_bucket_mb: float = Field(256.0, gt=0)  # collective: MiB per broadcast
    # vllm: the dtype weight syncs send (workers.precision.resolve_sync_dtype); auto: bfloat16
    # when the trainer computes in bf16 (precision bf16 or bf16-mixed), else vllm.dtype when set,
    # else float32. hf replicas are sent their own dtype (generation.dtype)
    sync_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per replica (pin to nodes)
    vllm: VLLMSettings = VLLMSettings()

    @model_validator(mode="after")
    def _sleep_needs_gpu(self) -> GenerationConfig:
        if self.vllm.sleep and self.num_gpus == 0:
            raise ValueError("vllm.sleep needs a GPU: set num_gpus > 0, or sleep: false on CPU")
        return self

    @model_validator(mode="after")
    def _dtype_is_hf(self) -> GenerationConfig:
        if self.backend == "vllm" and self.dtype != "auto":
            raise ValueError("dtype is the hf backend's; a vllm engine's dtype is vllm.dtype")
        if self.backend == "vllm" and self.kv_cache_budget_gb != "auto":
            raise ValueError("kv_cache_budget_gb is the hf backend's; a vllm engine's KV cache is "
                             "vllm.gpu_memory_utilization (GPU) or vllm.kv_cache_space_gb (CPU)")
        if self.backend == "hf" and self.sync_dtype != "auto":
            raise ValueError("sync_dtype is the vllm backend's; hf replicas are sent their own dtype (generation.dtype)")
        return self


class TrainerConfig(TrainerSection):
    """``models[].trainer``: the ranks' section (the optimiser and the update: ``TrainerSection``)
    and what the driver reads."""

    backend: TrainerBackend = "torch"
    workers: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0, ge=0)  # per data-parallel rank
    num_threads: int = Field(0, ge=0)  # torch threads per rank; 0: auto (orchestrator.cluster.model_actors.threads_for)
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per rank (pin to nodes)

    @model_validator(mode="after")
    def _deepspeed_precision(self) -> TrainerConfig:
        """The deepspeed backend's precision is its engine's ``bf16`` switch
        (``workers.precision.deepspeed_bf16``, checked here without torch)."""
        if self.backend != "deepspeed" or self.precision == "auto":
            return self
        if self.precision == "bf16":
            raise ValueError("precision bf16: the deepspeed backend keeps fp32 master weights; use "
                             "bf16-mixed (DeepSpeed's bf16) or fp32")
        wanted = self.precision == "bf16-mixed"
        if self.deepspeed.bf16 is not None and self.deepspeed.bf16 != wanted:
            raise ValueError(f"precision {self.precision} contradicts deepspeed.bf16: {self.deepspeed.bf16}; "
                             "set one of them")
        return self


class LoraSettings(Strict):
    """LoRA adapters on a frozen base (``models[].lora``, ``workers.lora``, with peft): the
    trainer trains and checkpoints the adapters only, a weight sync sends them only, the final
    export merges them (and keeps them in ``final/<model>/adapter``)."""

    r: int = Field(8, ge=1)  # the adapters' rank
    alpha: float = Field(16.0, gt=0)  # scale alpha / r of the adapters' output
    dropout: float = Field(0.0, ge=0, lt=1)  # on the adapters' input, in the update's forwards only
    # module names (suffixes, peft's matching), "all-linear", or None: peft's default for the
    # architecture (llama, qwen2: q_proj, v_proj; gpt2: c_attn); checked against the model at start
    target_modules: list[str] | Literal["all-linear"] | None = None

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name(cls, names: Any) -> Any:
        """One module name may be given as a string."""
        return [names] if isinstance(names, str) and names != "all-linear" else names

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, names: list[str] | str | None) -> list[str] | str | None:
        if isinstance(names, list):
            if not names:
                raise ValueError("give at least one module name, 'all-linear', or leave it unset (peft's default)")
            bad = [n for n in names if not n.strip()]
            if bad or len(set(names)) != len(names):
                raise ValueError(f"expected distinct, non-empty module names, got {names}")
        return names


class ModelConfig(ModelSection):
    """One model: the section its actors share (trust_remote_code, chat_template, pad_token:
    ``ModelSection``) and where its weights come from, its actors and adapters."""

    name: SafeName
    # a transformers folder, a .gguf file, package:<python package>/<file> (workers.zoo.packaged), or a
    # Hugging Face hub id (org/name, kept as given: each actor resolves it in its node's cache, workers.hub)
    path: Path | None = None
    builder: ModelSpec | None = None  # a tiny model built in code (workers.zoo.model_zoo)
    # placement-group strategy of the model's actors: pack (few nodes) | spread (many nodes)
    placement: Literal["pack", "spread"] = "pack"
    generation: GenerationConfig = GenerationConfig()
    trainer: TrainerConfig = TrainerConfig()
    lora: LoraSettings | None = None  # None: the full model is trained

    @model_validator(mode="after")
    def _lora_needs_torch(self) -> ModelConfig:
        if self.lora is not None and self.trainer.backend == "deepspeed":
            raise ValueError("lora: the deepspeed trainer backend does not train LoRA adapters (ZeRO shards "
                             "the full model's optimizer state); use trainer.backend: torch, or drop lora")
        return self

    @model_validator(mode="before")
    @classmethod
    def _builder_takes_the_model_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("builder"), dict):
            data = {**data, "builder": {"name": str(data.get("name", "")), **data["builder"]}}
        return data

    @field_validator("path")
    @classmethod
    def _path_exists(cls, path: Path | None) -> Path | None:
        if path is not None and str(path).startswith(PACKAGE_PREFIX):
            locate(path)  # says which package is missing
        elif path is not None and not path.exists():
            repo_id = hub_id(path)
            if repo_id is None:
                raise ValueError(f"no model folder or .gguf file at {path}")
            check_hub_id(repo_id)  # HF_HUB_OFFLINE: it must be in this machine's cache
        return path

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.builder is None):
            raise ValueError("give exactly one of 'path' (a local model folder) or 'builder'")
        if self.builder is not None and self.generation.max_new_tokens >= self.builder.max_positions:
            raise ValueError(f"generation.max_new_tokens ({self.generation.max_new_tokens}) leaves no room for the "
                             f"prompt in the built model's builder.max_positions ({self.builder.max_positions}); "
                             f"lower it or raise builder.max_positions")
        return self


# Backends and the Python package each needs (the optional extras of pyproject.toml).
BACKEND_PACKAGES = {"vllm": "vllm", "deepspeed": "deepspeed"}


def missing_package(backend: str) -> str | None:
    """The package a backend needs that this Python environment lacks, if any."""
    package = BACKEND_PACKAGES.get(backend)
    return package if package and importlib.util.find_spec(package) is None else None
