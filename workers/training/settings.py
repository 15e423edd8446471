"""What a trainer rank is told when it starts: the config's own sections, one frozen record.

The fields a rank reads as configured are declared here, once, in the sections the config
extends (``orchestrator.config``): :class:`TrainerSection` is ``models[].trainer``'s,
:class:`UpdateSection` ``algorithm``'s, :class:`ReceiverSection` ``exchange``'s receiver side,
``workers.rollout.settings.ModelSection`` ``models[]``'s. ``orchestrator.cluster.model_actors``
builds :class:`TrainerSettings` from the config's section objects (``TrainerSettings.of``: every
field of each section, none copied by hand) and what it derives (threads, world size, device,
LoRA, sync dtype, seed, run.async), then applies what the exchange policy asks of every rank
(``ExchangePolicy.trainer_params``, :meth:`TrainerSettings.with_changes`); every trainer backend
takes it whole. A setting that is not a field here is an error that names it, wherever it comes
from (a policy's parameters, a test, a benchmark), never a keyword silently swallowed. A name
field is checked against its registry (``workers.registries``), so a registered plugin is accepted.

The defaults are the paper's (``docs/algorithm.md``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from graftpool.sections import Settings, Strict, registered
from workers.receiver.gate_kinds import GATE_KINDS
from workers.receiver.minibatch import PLACEMENTS, Split
from workers.receiver.peer_transfer import PEER_ADVANTAGES, GateScope, PeerResponses
from workers.registries import LOSS_NORMALIZERS, PEER_RATIOS, PRECISIONS
from workers.rollout.settings import ModelSection
from workers.training.host_memory import MAX_MMAP_THRESHOLD_MIB
from workers.training.sampling_logprobs import Mode

PrecisionName = registered(PRECISIONS, "auto")
LossNormalizerName = registered(LOSS_NORMALIZERS)
PeerRatioName = registered(PEER_RATIOS)
PeerAdvantageName = registered(PEER_ADVANTAGES)
PlacementName = registered(PLACEMENTS)
GateKindName = registered(GATE_KINDS)


class DeepSpeedSettings(Strict):
    """``models[].trainer.deepspeed``: ZeRO settings of the ``deepspeed`` trainer (ignored by ``torch``)."""

    zero_stage: Literal[2, 3] = 2
    bf16: bool | None = None  # None: bf16 on GPU, fp32 on CPU
    # ZeRO-3: parameters of fewer elements than this stay whole on every rank, never partitioned
    # (DeepSpeed's stage3_param_persistence_threshold); None: DeepSpeed's default, 100,000
    param_persistence_threshold: int | None = Field(None, ge=0)


class TrainerSection(Strict):
    """``models[].trainer``: the optimiser (AdamW) and how a rank executes the update."""

    lr: float = Field(1e-6, gt=0)
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.999)  # AdamW's, each in [0, 1)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1)  # micro-batches per minibatch (one optimizer step each minibatch)
    # micro-batches packed by tokens (a rank's forward: rows x longest row <= this), for scoring and the update;
    # None: grad_accum micro-batches of equal row counts (scoring: 256 rows a forward); a peer response
    # whose row is longer is neither scored nor trained (workers.receiver.retokenize.over_budget)
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
    # workers.registries.PRECISIONS: fp32 | bf16-mixed (autocast bf16 forwards, fp32 master weights and
    # AdamW state) | bf16 (bf16 weights); auto: bf16-mixed on a GPU, fp32 on a CPU (workers.precision).
    # deepspeed: bf16-mixed is its bf16, fp32 its fp32; bf16 is refused
    precision: PrecisionName = "auto"
    # the dtype of the final model's files (workers.model_export): auto: the compute dtype (bfloat16 under
    # bf16-mixed / bf16 / deepspeed's bf16, float32 under fp32); checkpoints keep the weights as kept
    export_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    deepspeed: DeepSpeedSettings = DeepSpeedSettings()  # the deepspeed backend's engine (workers.training.deepspeed_trainer)


class UpdateSection(Strict):
    """``algorithm``: the clipped objective (Eq. 10) and how the step's rows are cut into updates."""

    eps_low: float = Field(0.2, ge=0, lt=1)  # the clip's floor 1 - eps_low stays above 0
    eps_high: float = Field(0.28, ge=0)
    minibatches: int = Field(4, ge=1)
    # how the step's rows become minibatches (workers.receiver.minibatch): rows (verl: equal runs of the
    # ordered rows, a fixed number of optimizer steps) | groups (whole groups; a gated-out group keeps its slot)
    minibatch_split: Split = "rows"
    epochs: int = Field(1, ge=1)
    # a minibatch's token-mean denominator (workers.registries.LOSS_NORMALIZERS): minibatch (paper) | step
    loss_normalizer: LossNormalizerName = "minibatch"
    # where pi_old comes from (workers.training.sampling_logprobs): auto skips the extra forward pass when the
    # update is one optimizer step (exactly on-policy) and takes the behaviour log-probs under run.async
    # one_step; recompute always runs the pass; sampling takes the behaviour log-probs
    old_logprobs: Mode = "auto"


class ReceiverSection(Strict):
    """``exchange``: how a receiver takes in the peer data a transfer routes to it (gate Eqs. 6-8,
    peer rows, their ratio; workers.receiver.peer_transfer)."""

    delta: float = Field(0.8, ge=0)  # the gate's threshold on s (Eq. 8)
    gate: bool = True  # False: the no-gate ablation (w = 1 for every grafted response)
    gate_scope: GateScope = "response"  # group: admit or drop a group on its mean s
    # what s is computed on (workers.receiver.gate_kinds): token_mean (paper) | per_byte | answer_masked | self_calibrated
    gate_kind: GateKindName = "token_mean"
    peer_responses: PeerResponses = "all"  # success: only the donor's correct responses
    peer_advantages: PeerAdvantageName = "donor"  # donor | pooled | recentered | asymmetric (PEER_ADVANTAGES)
    peer_beta: float = Field(0.5, ge=0, le=1)  # asymmetric: the scale of negative peer advantages
    # where peer groups go among the minibatches (workers.receiver.minibatch): last (paper) | first | spread
    peer_placement: PlacementName = "last"
    # peer tokens' term in Eq. 10 (workers.registries.PEER_RATIOS): clip (paper) | shaped (LUFFY's
    # f(pi) = pi / (pi + gamma))
    peer_ratio: PeerRatioName = "clip"
    shaping_gamma: float = Field(0.1, gt=0)  # LUFFY's gamma (peer_ratio: shaped)


class TrainerSettings(ModelSection, TrainerSection, UpdateSection, ReceiverSection, Settings):
    """Every setting of a trainer rank: its sections' fields, then what the driver derives."""

    num_threads: int = 1  # torch threads (models[].trainer.num_threads, 0 resolved by threads_for)
    world_size: int = 1  # data-parallel ranks of the model (models[].trainer.workers)
    device: str = "cpu"  # cuda where models[].trainer.num_gpus > 0
    lora: dict[str, Any] | None = None  # models[].lora plus the model's init_seed (workers.lora)
    # what a weight sync sends: an hf replica's own dtype, a vllm replica's resolve_sync_dtype (workers.precision)
    sync_dtype: str = "float32"
    overlapped: bool = False  # run.async one_step: the step's responses were sampled one update earlier
    seed: int = 0
    sgt_coef: float = 0.1  # lambda of the SGT objective (policies.sgt's trainer_params)
    kind_modules: tuple[str, ...] = ()  # modules registering a transfer's own row kinds (policies.transfer)
