"""``models:``: each model's weights, generation backend, trainer and LoRA adapters."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.cluster.weight_sync_modes.base import WEIGHT_SYNCS
from orchestrator.config.base import SafeName, Strict
from workers.hub import check_hub_id, hub_id
from workers.training.host_memory import MAX_MMAP_THRESHOLD_MIB
from workers.zoo.packaged import PACKAGE_PREFIX, locate
from workers.zoo.zoo_spec import ModelSpec

GPU_MEMORY_SHARE = 0.9
"""vLLM's own default ``gpu_memory_utilization``: a replica alone on its GPU takes this share."""
CPU_MEMORY_SHARE = 0.15
"""``gpu_memory_utilization`` of a CPU engine (its KV cache is ``kv_cache_space_gb``)."""


class VLLMSettings(Strict):
    """Engine settings of the ``vllm`` backend (ignored by ``hf``)."""

    # 1 only (checked below): one engine per replica, on the replica's own GPU; scale out with replicas
    tensor_parallel_size: int = Field(1, ge=1)
    # None: auto by device (VLLMSettings.resolved): on a GPU 0.9 x the replica's share of it
    # (min(num_gpus, 1)), on CPU 0.15 (there: the fraction of host memory)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    kv_cache_space_gb: float = Field(1.0, gt=0)  # CPU only (VLLM_CPU_KVCACHE_SPACE)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    max_model_len: int | None = Field(None, ge=16)
    # no CUDA graphs, no torch.compile (the sampler's ops included); None: auto, false on a GPU
    # (CUDA graphs), true on CPU (no C++ kernel build at the first generate call)
    enforce_eager: bool | None = None
    sleep: bool = False  # GPU only: offload weights and free the KV cache between generate calls

    def resolved(self, num_gpus: float) -> VLLMSettings:
        """The settings with ``auto`` (None) resolved by the replica's device, ``num_gpus`` > 0
        being a GPU: ``gpu_memory_utilization`` = ``GPU_MEMORY_SHARE`` x min(num_gpus, 1) (vLLM's
        own 0.9, split as Ray splits the GPU among replicas with a fractional ``num_gpus``; the
        trainer on that GPU keeps the rest), CPU ``CPU_MEMORY_SHARE``; ``enforce_eager`` =
        ``num_gpus == 0`` (CUDA graphs on a GPU, eager on CPU)."""
        on_gpu = num_gpus > 0
        share = round(GPU_MEMORY_SHARE * min(num_gpus, 1.0), 4) if on_gpu else CPU_MEMORY_SHARE
        return self.model_copy(update={
            "gpu_memory_utilization": share if self.gpu_memory_utilization is None else self.gpu_memory_utilization,
            "enforce_eager": (not on_gpu) if self.enforce_eager is None else self.enforce_eager})

    @field_validator("tensor_parallel_size")
    @classmethod
    def _one_gpu_per_engine(cls, size: int) -> int:
        """Inside a Ray actor vLLM with tensor_parallel_size > 1 starts its own Ray executor, which
        asks the cluster for GPU bundles the actor's placement group already holds: the engine
        waits for GPUs it never gets, or lands on others. Refused until an executor that works
        inside the actor's bundle (vLLM's ``mp``) is run and tested on GPUs."""
        if size != 1:
            raise ValueError(f"models[].generation.vllm.tensor_parallel_size {size}: a vLLM engine runs inside its "
                             "replica's Ray actor on one GPU; tensor parallelism would start vLLM's own Ray executor, "
                             "which waits for GPUs the replica's placement group already holds. Set it to 1 and use "
                             "more replicas (models[].generation.replicas, one GPU each) for throughput")
        return size


class GenerationConfig(Strict):
    backend: Literal["hf", "vllm"] = "hf"
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(16, ge=1)
    batch_size: int = Field(256, ge=1)  # hf only: sequences per generate call (vllm schedules its own batches)
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
    weight_sync: str = "object_store"
    sync_bucket_mb: float = Field(256.0, gt=0)  # collective: MiB per broadcast
    # vllm: the dtype weight syncs send (workers.training.precision.resolve_sync_dtype); auto: bfloat16
    # when the trainer computes in bf16 (precision bf16 or bf16-mixed), else vllm.dtype when set,
    # else float32. hf replicas are sent their own dtype (generation.dtype)
    sync_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per replica (pin to nodes)
    # hf only: the replicas' weights and forward (workers.training.precision); auto: bfloat16 on a GPU,
    # float32 on a CPU. The trainer casts the weights it sends to it. vllm: vllm.dtype
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    vllm: VLLMSettings = VLLMSettings()

    @field_validator("weight_sync")
    @classmethod
    def _registered_weight_sync(cls, name: str) -> str:
        if name not in WEIGHT_SYNCS.names():
            raise ValueError(f"expected one of {WEIGHT_SYNCS.names()}, got {name!r}")
        return name

    @model_validator(mode="after")
    def _sleep_needs_gpu(self) -> GenerationConfig:
        if self.vllm.sleep and self.num_gpus == 0:
            raise ValueError("vllm.sleep needs a GPU: set num_gpus > 0, or sleep: false on CPU")
        return self

    @model_validator(mode="after")
    def _dtype_is_hf(self) -> GenerationConfig:
        if self.backend == "vllm" and self.dtype != "auto":
            raise ValueError("dtype is the hf backend's; a vllm engine's dtype is vllm.dtype")
        if self.backend == "hf" and self.sync_dtype != "auto":
            raise ValueError("sync_dtype is the vllm backend's; hf replicas are sent their own dtype (generation.dtype)")
        return self


class DeepSpeedSettings(Strict):
    """ZeRO settings of the ``deepspeed`` trainer (ignored by ``torch``)."""

    zero_stage: Literal[2, 3] = 2
    bf16: bool | None = None  # None: bf16 on GPU, fp32 on CPU
    # ZeRO-3: parameters of fewer elements than this stay whole on every rank, never partitioned
    # (DeepSpeed's stage3_param_persistence_threshold); None: DeepSpeed's default, 100,000
    param_persistence_threshold: int | None = Field(None, ge=0)


class TrainerConfig(Strict):
    backend: Literal["torch", "deepspeed"] = "torch"
    lr: float = Field(1e-6, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)  # AdamW's, each in [0, 1)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1)  # micro-batches per minibatch (one optimizer step each minibatch)
    workers: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0, ge=0)  # per data-parallel rank
    num_threads: int = Field(0, ge=0)  # torch threads per rank; 0: auto (orchestrator.cluster.model_actors.threads_for)
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per rank (pin to nodes)
    # micro-batches packed by tokens (rows x longest row <= this), for scoring and the update;
    # None: grad_accum micro-batches of equal row counts (scoring: 256 rows a forward)
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    # log-probs of the sampled tokens from the LM head in chunks of this many response tokens,
    # never a full [rows, T, vocab] log-softmax; None: the model's full logits (reference path)
    logprob_chunk_tokens: int | None = Field(1024, ge=1)
    # rows that share a prompt run its prefix through the backbone once (workers.training.logprobs.row_logprobs)
    share_prompts: bool = True
    # glibc's mmap threshold fixed at this many MiB in each rank's process: tensors this size or
    # more go back to the system when freed, so the peak RSS stays near the live tensors' (12-17%
    # more train-phase time in bench-step's sweep); 0: glibc's default, a threshold that rises (workers.training.host_memory)
    mmap_threshold_mib: float = Field(0, ge=0, le=MAX_MMAP_THRESHOLD_MIB)
    # recompute each decoder layer's activations in the backward instead of keeping them (HF models,
    # torch and deepspeed backends): less trainer memory for about one more forward per update
    gradient_checkpointing: bool = False
    # the own / peer parts of each mixed update's gradient norm (train/peer_grad_share): one gradient
    # copy on the trainer's device per mixed update, two floats to the host (workers.training.diagnostics)
    grad_parts: bool = True
    # fp32 | bf16-mixed (autocast bf16 forwards, fp32 master weights and AdamW state) | bf16 (bf16
    # weights); auto: bf16-mixed on a GPU, fp32 on a CPU (workers.training.precision). deepspeed: bf16-mixed
    # is its bf16, fp32 its fp32; bf16 is refused
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    deepspeed: DeepSpeedSettings = DeepSpeedSettings()

    @model_validator(mode="after")
    def _deepspeed_precision(self) -> TrainerConfig:
        """The deepspeed backend's precision is its engine's ``bf16`` switch
        (``workers.training.precision.deepspeed_bf16``, checked here without torch)."""
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
    """LoRA adapters on a frozen base (``models[].lora``, ``workers.training.lora``, with peft): the
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


class ModelConfig(Strict):
    name: SafeName
    # a transformers folder, a .gguf file, package:<python package>/<file> (workers.zoo.packaged), or a
    # Hugging Face hub id (org/name, kept as given: each actor resolves it in its node's cache, workers.hub)
    path: Path | None = None
    builder: ModelSpec | None = None  # a tiny model built in code (workers.zoo.model_zoo)
    trust_remote_code: bool = False
    # auto: prompts are rendered with the tokenizer's chat template when it has one (workers.rollout.chat)
    chat_template: Literal["auto", "none"] = "auto"
    # the tokenizer's pad token (one of its tokens); None: its own, else its EOS token (a Llama-3
    # tokenizer has none), said once at load (workers.rollout.tokenizer.load_tokenizer)
    pad_token: str | None = Field(None, min_length=1)
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
