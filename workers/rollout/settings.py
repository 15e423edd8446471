"""What a generation replica is told when it starts: the config's own sections, one frozen record.

The fields a replica reads as configured are declared here, once, in the sections the config
extends (``orchestrator.config``: :class:`ModelSection` is ``models[]``'s, :class:`GenerationSection`
``models[].generation``'s, :class:`VLLMSettings` ``models[].generation.vllm``);
``orchestrator.cluster.model_actors`` builds :class:`GenerationSettings` from the config's
section objects (``GenerationSettings.of``, no field copied by hand) and what it derives (the
model's path, seeds, threads, niceness, device, the resolved vLLM engine). The generation worker
hands it to its backend's factory (``workers.registries.BACKENDS``). A setting that is not a
field is an error naming it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, InstanceOf, field_validator

from graftpool.sections import Settings, Strict, registered
from workers.model_files import ModelSource
from workers.registries import BACKENDS

GPU_MEMORY_SHARE = 0.9
"""vLLM's own default ``gpu_memory_utilization``: a replica alone on its GPU takes this share."""
CPU_MEMORY_SHARE = 0.15
"""``gpu_memory_utilization`` of a CPU engine (its KV cache is ``kv_cache_space_gb``)."""
BackendName = registered(BACKENDS)
"""``models[].generation.backend``: a name in :data:`workers.registries.BACKENDS` (hf, vllm, a plugin's)."""


class ModelSection(Strict):
    """``models[]``: how a model is loaded and how it renders a prompt (trainer ranks and replicas)."""

    trust_remote_code: bool = False
    # auto: prompts are rendered with the tokenizer's chat template when it has one (workers.rollout.chat)
    chat_template: Literal["auto", "none"] = "auto"
    # the tokenizer's pad token (one of its tokens); None: its own, else its EOS token (a Llama-3
    # tokenizer has none), said once at load (workers.rollout.tokenizer.load_tokenizer)
    pad_token: str | None = Field(None, min_length=1)


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


class GenerationSection(Strict):
    """``models[].generation``: what a replica reads as configured."""

    backend: BackendName = "hf"
    batch_size: int = Field(256, ge=1)  # hf only: sequences per generate call (vllm schedules its own batches)
    # hf only: the replicas' weights and forward (workers.precision); auto: bfloat16 on a GPU,
    # float32 on a CPU. The trainer casts the weights it sends to it. vllm: vllm.dtype
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # hf only: GiB of KV cache one generate call may reserve; a call of more rows is sampled in
    # sub-batches that fit (workers.rollout.kv_budget). auto: on a GPU 0.9 x the replica's share of
    # it less its weights; on a CPU 0.9 of the host memory available. vllm: vllm.gpu_memory_utilization / kv_cache_space_gb
    kv_cache_budget_gb: Literal["auto"] | Annotated[float, Field(gt=0)] = "auto"


class GenerationSettings(ModelSection, GenerationSection, Settings):
    """Every setting of one generation replica: its sections' fields, then what the driver derives."""

    path: str | InstanceOf[ModelSource] = ""  # the model folder or hub id (workers.model_files: perhaps shipped)
    seed: int = 0  # the replica's sampling seed
    num_threads: int = 1  # torch threads (models[].generation.num_threads, 0 resolved by threads_for)
    nice: int = 0  # the process's CPU niceness, 0-19 (workers.rollout.cpu_priority); 0: left as it is
    lora: dict[str, Any] | None = None  # models[].lora plus the model's init_seed (workers.lora)
    device: str = "cpu"
    gpu_share: float = 1.0  # the replica's share of its GPU, min(num_gpus, 1): hf's kv_cache_budget_gb auto
    vllm: VLLMSettings = VLLMSettings().resolved(0)  # models[].generation.vllm resolved by the device
