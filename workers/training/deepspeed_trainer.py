"""The ``deepspeed`` trainer backend: the torch trainer's objective and batches, with the
model and optimizer wrapped by a DeepSpeed ZeRO engine (stage 2 or 3).

What DeepSpeed changes, and nothing else:
- the AdamW optimizer (a client optimizer, the same ``torch.optim.AdamW`` as the ``torch``
  backend) is partitioned by ZeRO across the data-parallel ranks; stage 3 also partitions
  the weights, which are gathered for a forward pass, a weight sync and an export;
- gradients are averaged over ranks by DeepSpeed, so each rank's loss share is multiplied
  by the world size (the torch backend sums instead); gradient accumulation is ours
  (``managed_gradient_accumulation: false``): ``grad_accum`` micro-batches, one
  ``engine.step()`` per minibatch, so a minibatch is one update of Eq. 10 as in ``torch``;
- ZeRO-2 over several ranks runs the update's forwards without shared prompt prefixes
  (``trainer.share_prompts``, :attr:`DeepSpeedTrainer.update_shares_prompts`): its gradient buckets need
  every rank's backward graph alike;
- clipping is DeepSpeed's ``gradient_clipping``; bf16 on a GPU, fp32 on the CPU
  (``trainer.precision``: ``bf16-mixed`` is the engine's bf16, whose optimizer keeps fp32
  master weights, ``fp32`` is bf16 off, ``bf16`` is refused; ``workers.precision.deepspeed_bf16``);
  under bf16 the module computes in bf16, so each micro-batch's gradient (and its reduction over
  the ranks) is bf16, and ZeRO-3 sums a minibatch's micro-batches into fp32 partitions
  (:func:`deepspeed_config`), as the torch backend's ``bf16-mixed`` sums its fp32 gradients;
- checkpoints are DeepSpeed's own ``save_checkpoint``/``load_checkpoint`` (every rank
  writes its optimizer partition), with the policy version and RNG states as client state.

On a machine without CUDA, ``DS_ACCELERATOR=cpu`` is set before DeepSpeed is imported. Its
CPU comm backend would then compile its shared-memory op with the C++ compiler when the
process group starts (about 40 s on 2 cores, again for every environment's path); only
DeepSpeed-Inference's ``inference_all_reduce`` uses that op, never ZeRO training, which reduces
over the torch process group (gloo). So it is marked as not buildable here
(:func:`skip_inference_shm_op`) and nothing is compiled.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from graftpool.step_record import StepRecord
from workers.model_export import host_copies, save_model
from workers.model_files import ModelSource
from workers.precision import deepspeed_bf16, resolve_export_dtype
from workers.training.rank_share import rank_share
from workers.training.rng_state import restore_torch_rng, torch_rng_states
from workers.training.settings import TrainerSettings
from workers.training.trainer import TorchTrainer, register_trainer

if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402 - after DS_ACCELERATOR
from deepspeed.utils import safe_get_full_fp32_param  # noqa: E402


def skip_inference_shm_op() -> None:
    """On the CPU accelerator, mark DeepSpeed's shared-memory comm op incompatible, so that
    ``TorchBackend`` skips building it (``build_shm_op`` returns None): training never calls
    ``inference_all_reduce``, the one user of the op. DeepSpeed keeps ``__compatible_ops__``
    as one module-level dict, probed on first access; the edit is what the backend reads."""
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def deepspeed_config(zero_stage: int, grad_accum: int, grad_clip: float, bf16: bool,
                     param_persistence_threshold: int | None = None) -> dict:
    """The engine config; batch sizes are nominal (the trainer builds its own batches).
    ``param_persistence_threshold`` (ZeRO-3; None: DeepSpeed's 100,000 elements): smaller
    parameters stay whole on every rank, larger ones are partitioned and gathered for each
    forward and backward.

    ZeRO-3 under bf16 sums a minibatch's gradient g = sum_k g_k over its micro-batches k (one
    ``backward`` each; the GPU template's 256 rows a minibatch under a 5,120-token budget over two
    ranks are 26 micro-batches of 1,000-token rows, 128 of 5,120-token ones) into fp32 partitions
    (``data_types.grad_accum_dtype``). DeepSpeed's default, the model's bf16, rounds every partial
    sum to 8 significant bits: over 32 micro-batches 0.7 % of the gradient's L2 norm, up to 2.8 %
    of a tensor's largest element (measured on CPU). The fp32 partitions cost 2 bytes a parameter
    / ranks more (3.1 GB a rank for a 3 B model over two)."""
    zero = {"stage": zero_stage}
    if param_persistence_threshold is not None:
        zero["stage3_param_persistence_threshold"] = param_persistence_threshold
    accumulation = {"data_types": {"grad_accum_dtype": "fp32"}} if bf16 and zero_stage == 3 else {}
    return {
        **accumulation,
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": grad_accum,
        "managed_gradient_accumulation": False,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,  # torch AdamW as the client optimizer
        "bf16": {"enabled": bf16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


@register_trainer("deepspeed")
class DeepSpeedTrainer(TorchTrainer):
    """ZeRO-2/3 over ``world_size`` Ray actors. The engine is built in
    :meth:`init_process_group` (DeepSpeed needs the process group first), which the
    controller calls on every rank right after the actors start."""

    def __init__(self, path: str | Path | ModelSource, settings: TrainerSettings | None = None, rank: int = 0,
                 **changes):
        """``settings`` as :class:`TorchTrainer`'s; ``settings.deepspeed`` is ``models[].trainer.deepspeed``
        (``zero_stage``, ``bf16``, ``param_persistence_threshold``), ``settings.precision`` the engine's
        bf16 switch."""
        s = (settings or TrainerSettings(device="cuda" if torch.cuda.is_available() else "cpu")).with_changes(**changes)
        if s.lora is not None:
            raise ValueError("models[].lora: the deepspeed trainer backend does not train LoRA adapters; "
                             "use trainer.backend: torch")
        bf16 = deepspeed_bf16(s.precision, s.deepspeed.bf16)  # bf16-mixed: the engine's bf16 over fp32 masters
        # the engine casts the module and keeps the fp32 masters itself: no autocast of ours
        super().__init__(path, s.with_changes(precision="fp32"), rank)
        self.zero_stage = s.deepspeed.zero_stage
        self.param_persistence_threshold = s.deepspeed.param_persistence_threshold
        self.bf16 = self.device.type == "cuda" if bf16 is None else bf16
        self.engine = None

    def init_process_group(self, master_port: int, master_addr: str = "127.0.0.1") -> bool:
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        skip_inference_shm_op()
        deepspeed.init_distributed(dist_backend=self.dist_backend, auto_mpi_discovery=False, rank=self.rank,
                                   world_size=self.world_size)
        config = deepspeed_config(self.zero_stage, self.settings.grad_accum, self.settings.grad_clip, self.bf16,
                                  self.param_persistence_threshold)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(model=self.model, optimizer=self.optimizer,
                                                                 config=config)
        self.model = self.engine  # forward passes go through the engine (ZeRO-3 gathers)
        return True

    def _engine(self):
        if self.engine is None:
            raise RuntimeError("DeepSpeedTrainer: call init_process_group(port) before using the trainer")
        return self.engine

    def _score_share(self, rows: StepRecord) -> list[torch.Tensor]:
        """Under ZeRO-3 a forward gathers the partitioned weights collectively, so every rank runs
        the same forwards: each scores every row and answers its share; under ZeRO-2, its share only."""
        if self.zero_stage != 3:
            return super()._score_share(rows)
        return self.score_rows(rows)[rank_share(len(rows), self.rank, self.world_size)]

    @property
    def update_shares_prompts(self) -> bool:
        """False for a ZeRO-2 rank of several: ZeRO-2 reduces gradients in flat buckets laid out in the
        order the parameters' gradients become ready, and sums the ranks' buckets position by position,
        so the ranks' backward graphs must match. A rank whose rows share a prompt (the shared-prefix
        forward) beside one whose rows do not (the padded forward) readied them in another order, and
        the summed gradient mixed parameters (two ranks, three micro-batches: the losses 2x off after
        three steps). Scoring, without gradients, still shares (``TorchTrainer._logprobs``)."""
        return self.zero_stage == 3 or self.world_size == 1

    # -- the update hooks ---------------------------------------------------------------

    def _zero_grad(self) -> None:
        """Nothing to do: ``engine.step()`` zeroes the gradients after each update."""

    def _backward(self, loss: torch.Tensor) -> None:
        # DeepSpeed averages gradients over ranks; each rank's loss is its share of the sum
        self._engine().backward(loss * self.world_size, scale_wrt_gas=False)

    def _grad_snapshot(self) -> list[torch.Tensor | None] | None:
        """ZeRO partitions and reduces gradients inside the engine: the own / peer split of an
        update's gradient is not read here (reported as NaN)."""
        return None

    def _reduce_gradients(self) -> None:
        """Nothing to do: ``engine.step()`` reduces the gradients."""

    def _optimizer_step(self) -> float:
        engine = self._engine()
        engine.step()
        norm = engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    # -- weights and checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full fp32 weights on the CPU; under ZeRO-3 every rank must call this (a gather)."""
        weights = self._full_weights(keep=True)
        assert weights is not None
        return weights

    def _full_weights(self, keep: bool, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor] | None:
        """The full weights on the CPU where ``keep``, else None: floating-point ones in ``dtype``,
        integer buffers as they are. Under ZeRO-3 every rank must call this (the gather is
        collective); only a rank that keeps the weights copies them to the host: a sync or an
        export needs rank 0's, and a copy on every rank of a node would be the model's fp32 size
        times its ranks in host memory (96 GB for 8 ranks of a 3 B model). Entries that share
        storage (a tied LM head's and its embedding's) stay one host tensor, as in the torch
        trainer's state dict: a sync sends it once and ``save_pretrained`` writes it once."""
        module = self._engine().module
        with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=self.zero_stage == 3):
            if not keep:
                return None
            return host_copies(module.state_dict(), dtype)  # cast on the device, then copied

    def _with_masters(self, weights: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
        """``weights`` (rank 0's; None elsewhere) with each parameter replaced by the optimizer's
        fp32 master of it (DeepSpeed's ``safe_get_full_fp32_param``: assembled from the ranks'
        partitions, so every rank calls this), one parameter on the device at a time; a tied
        parameter (two names) is one host tensor."""
        masters: dict[int, torch.Tensor | None] = {}  # a parameter's id -> its host copy (rank 0)
        for name, param in self._engine().module.named_parameters(remove_duplicate=False):
            if id(param) not in masters:  # every rank skips the same repeats: the gathers match
                master = safe_get_full_fp32_param(param)
                masters[id(param)] = master.detach().cpu().clone() if weights is not None else None
            if weights is not None:
                weights[name] = masters[id(param)]
        return weights

    def _sync_source(self) -> dict[str, torch.Tensor] | None:
        return self.weights_for_sync()  # ZeRO-3: every rank takes part in the gather

    def weights_for_sync(self) -> dict[str, torch.Tensor] | None:
        """Rank 0's full weights on the host in ``sync_dtype`` (cast before the copy: 2 bytes a
        parameter in bf16, not an fp32 copy of 4 then a cast); other ranks None."""
        return self._full_weights(keep=self.rank == 0, dtype=self.sync_dtype)

    def export(self, folder: str | Path) -> str:
        """The final model in ``export_dtype`` (auto: bf16 where the engine's ``bf16`` is on, whose
        module holds the masters cast to bf16; else fp32; ``float32`` under bf16: the fp32 masters);
        checkpoints keep the fp32 masters whatever it is."""
        dtype = resolve_export_dtype(self.settings.export_dtype, torch.bfloat16 if self.bf16 else torch.float32)
        masters = self.bf16 and dtype == torch.float32  # the masters, not the module's bf16 copy of them
        # under masters the gathered parameters are replaced; only the buffers are kept (save_model casts them)
        weights = self._full_weights(keep=self.rank == 0, dtype=torch.bfloat16 if masters else dtype)
        if masters:
            weights = self._with_masters(weights)
        if self.rank == 0:
            save_model(self._engine().module, folder, dtype, weights)
            self.tokenizer.save_pretrained(str(folder))
        return str(folder)

    def save(self, folder: str | Path) -> None:
        client = {"version": self.version, "rng": self.rng.bit_generator.state, **torch_rng_states(self.device)}
        self._engine().save_checkpoint(str(Path(folder) / "deepspeed"), tag="state", client_state=client)

    def load(self, folder: str | Path) -> int:
        path, client = self._engine().load_checkpoint(str(Path(folder) / "deepspeed"), tag="state")
        if path is None:
            raise FileNotFoundError(f"no DeepSpeed checkpoint under {folder}/deepspeed")
        self.version = int(client["version"])
        self.rng.bit_generator.state = client["rng"]
        restore_torch_rng(client, self.device)
        return self.version
