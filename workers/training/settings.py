"""What a trainer rank is told when it starts: one typed, frozen record.

``orchestrator.cluster.model_actors`` builds a :class:`TrainerSettings` from a model's
``models[].trainer`` section, the run's ``algorithm`` and ``exchange`` sections, and what the
exchange policy asks of every rank (``ExchangePolicy.trainer_params``, applied with
:meth:`TrainerSettings.with_changes`); every trainer backend takes it whole. A setting that is
not a field here is an error that names it, wherever it comes from (a policy's parameters, a
test, a benchmark), never a keyword silently swallowed.

The defaults are the paper's (``docs/algorithm.md``) and the config sections' defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any


@dataclass(frozen=True)
class TrainerSettings:
    """Every setting of a trainer rank, grouped by the config section it comes from."""

    # models[].trainer: the optimiser (AdamW) and how the update is executed
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    grad_accum: int = 1  # micro-batches per minibatch when max_tokens_per_micro_batch is unset
    max_tokens_per_micro_batch: int | None = None
    logprob_chunk_tokens: int | None = 1024
    share_prompts: bool = True
    precision: str = "auto"  # fp32 | bf16-mixed | bf16 | auto (workers.training.precision)
    num_threads: int = 1
    mmap_threshold_mib: float = 0  # glibc's mmap threshold, fixed (workers.training.host_memory); 0: its default
    gradient_checkpointing: bool = False  # recompute decoder layers in the backward (HF models)
    grad_parts: bool = True  # the own / peer gradient split of mixed updates (workers.training.diagnostics)
    world_size: int = 1  # data-parallel ranks of the model
    device: str = "cpu"
    # models[]: how the model is loaded and how it renders a prompt, and its LoRA adapters
    trust_remote_code: bool = False
    chat_template: str = "auto"
    pad_token: str | None = None  # models[].pad_token (None: the tokenizer's own, else its EOS)
    lora: dict[str, Any] | None = None  # models[].lora plus the model's init_seed (workers.training.lora)
    # what a weight sync sends: an hf replica's own dtype, a vllm replica's resolve_sync_dtype (workers.training.precision)
    sync_dtype: str = "float32"
    # algorithm: the clipped objective (Eq. 10) and how the step's rows are cut into updates
    eps_low: float = 0.2
    eps_high: float = 0.28
    minibatches: int = 4
    minibatch_split: str = "rows"  # rows | groups (workers.receiver.minibatch)
    epochs: int = 1
    old_logprobs: str = "auto"  # auto | recompute | sampling (workers.training.sampling_logprobs)
    overlapped: bool = False  # run.async one_step: the step's responses were sampled one update earlier
    loss_normalizer: str = "minibatch"  # minibatch | step
    seed: int = 0
    # exchange: the receiver side of a transfer (gate Eqs. 6-8, peer rows, their ratio)
    delta: float = 0.8
    gate: bool = True
    gate_scope: str = "response"
    peer_responses: str = "all"
    peer_advantages: str = "donor"
    peer_beta: float = 0.5
    peer_placement: str = "last"
    peer_ratio: str = "clip"
    shaping_gamma: float = 0.1
    sgt_coef: float = 0.1  # lambda of the SGT objective (policies.sgt)
    kind_modules: tuple[str, ...] = ()  # modules registering a transfer's own row kinds (policies.transfer)

    def with_changes(self, **changes: Any) -> TrainerSettings:
        """A copy with ``changes`` applied; a name that is not a setting raises ``TypeError``
        naming it and the settings there are."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TypeError(f"unknown trainer setting(s) {', '.join(unknown)}; "
                            f"the settings are: {', '.join(sorted(known))}")
        return replace(self, **changes)
