"""The ``torch`` trainer backend: old log-probs, re-tokenise + score + gate peers, update.

One :class:`TorchTrainer` per data-parallel rank. With ``world_size > 1`` every rank
holds the same weights, scores its share of the rows the controller asks it to score (the
driver concatenates the shares, and each rank's ``train`` fetches them all), computes the same
gate (it keeps the ranks in step without a gather), takes every ``world_size``-th response of each
minibatch, and gradients are summed with ``all_reduce`` over gloo, so the update equals
the single-process one: the token mean of Eq. 10 uses the global token count.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist  # the process group only: collectives go through workers.training.collectives
from transformers import AutoModelForCausalLM

from graftpool.contracts import OWN, ObjectiveSpec
from graftpool.step_record import OUTCOMES, StepRecord
from workers.dispatch import Dispatch, dispatch
from workers.hub import model_folder
from workers.lora import Adapters
from workers.model_export import host_copies, save_model
from workers.model_files import ModelSource, local_model
from workers.precision import SYNC_DTYPES, precision_for, resolve_export_dtype
from workers.receiver.gate_kinds import answer_start
from workers.receiver.kinds import ROW_KINDS, TrainerView, groups_of, kinds_in_order
from workers.receiver.objective import TokenObjective, make_objective
from workers.receiver.peer_transfer import PeerTransfer
from workers.receiver.receiver_batch import POLICY, ReceiverBatch
from workers.receiver.retokenize import budgeted_rows, response_end_id, retokenize, token_rows
from workers.registries import TRAINERS
from workers.rollout.chat import prompt_ids
from workers.rollout.tokenizer import load_tokenizer
from workers.rollout.weight_sync import SyncSource
from workers.training.checkpointing import enable_gradient_checkpointing
from workers.training.collectives import all_reduce, collective_device
from workers.training.diagnostics import peer_push
from workers.training.host_memory import set_mmap_threshold
from workers.training.logprobs import pack_by_tokens, row_logprobs
from workers.training.node_files import NodeFiles
from workers.training.rank_share import rank_share
from workers.training.rng_state import restore_torch_rng, torch_rng_states
from workers.training.sampling_logprobs import old_logp_source
from workers.training.settings import TrainerSettings
from workers.training.token_refs import put_rows, resolve
from workers.training.train_result import TrainResult, Update
from workers.training.update_loop import MinibatchUpdates

__all__ = ["TorchTrainer", "TrainResult", "TrainerSettings", "Update", "trainer_class"]

SCORE_ROWS = 256
"""Rows per no-grad scoring forward when ``max_tokens_per_micro_batch`` is not set."""


register_trainer = TRAINERS.register
trainer_class = TRAINERS.get  # the trainer backend class registered as a name (torch, deepspeed)


@register_trainer("torch")
class TorchTrainer(SyncSource, MinibatchUpdates, NodeFiles):
    """A plain torch trainer (AdamW). Backends subclass it and override the hooks
    ``_zero_grad``, ``_backward``, ``_optimizer_step``, ``state_dict``, ``save``/``load``.
    Its files reach a driver on another disk through :class:`NodeFiles`."""
    update_shares_prompts = True  # an update's forwards may share prompt prefixes (DeepSpeed ZeRO-2 ranks: not)

    def __init__(self, path: str | Path | ModelSource, settings: TrainerSettings | None = None, rank: int = 0, **changes):
        """``settings`` (default: :class:`TrainerSettings`'s defaults) with ``changes`` applied: a name that
        is not a setting raises ``TypeError`` naming it. Settings are read from ``self.settings``, never copied."""
        s = (settings or TrainerSettings()).with_changes(**changes)
        self.settings = s
        for module in s.kind_modules:  # a transfer's own row kinds (policies.transfer.Transfer.kind_modules)
            importlib.import_module(module)
        torch.set_num_threads(s.num_threads)
        set_mmap_threshold(s.mmap_threshold_mib)  # models[].trainer.mmap_threshold_mib (0: glibc's default)
        torch.manual_seed(s.seed)
        self.device = torch.device(s.device)
        # fp32 | bf16-mixed | bf16 (auto: by the device); workers.precision
        self.precision = precision_for(s.precision, self.device)
        self.sync_dtype = SYNC_DTYPES[s.sync_dtype]  # what weight syncs send (workers.precision)
        folder = model_folder(local_model(path))  # a shipped folder's copy here, a hub id's cached snapshot
        self.tokenizer = load_tokenizer(folder, s.trust_remote_code, s.pad_token)
        self.end_id = response_end_id(self.tokenizer, s.chat_template)  # how its own responses end: peers' too
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), trust_remote_code=s.trust_remote_code)
        self.precision.cast(self.model.to(self.device))
        # models[].lora (workers.lora): adapters injected into self.model in place, the base frozen
        self.adapters = None if s.lora is None else Adapters(self.model, s.lora)
        if s.gradient_checkpointing:  # models[].trainer.gradient_checkpointing (workers.training.checkpointing)
            enable_gradient_checkpointing(self.model, lora=self.adapters is not None)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # what AdamW updates
        self.optimizer = torch.optim.AdamW(self.params, lr=s.lr, betas=tuple(s.betas), weight_decay=s.weight_decay)
        self.transfer = PeerTransfer(s.delta, s.gate, s.peer_responses, s.gate_scope, s.peer_advantages, s.peer_beta,
                                     s.gate_kind)
        self.token_objective = TokenObjective(s.eps_low, s.eps_high, s.loss_normalizer, s.peer_ratio, s.shaping_gamma)
        self.rng = np.random.default_rng(s.seed)
        self.rank = rank
        self.version = 0
        # own responses' pi_old: the record's old_logp, else sg(pi_theta) (workers.training.sampling_logprobs)
        self.takes_old_logp = old_logp_source(s.old_logprobs, s.minibatches, s.epochs, s.overlapped) != "on_policy"

    @property
    def world_size(self) -> int:
        return self.settings.world_size

    # -- distributed set-up ---------------------------------------------------------

    @property
    def dist_backend(self) -> str:
        """NCCL for ranks on a GPU, gloo on CPU."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    @property
    def collective_device(self) -> torch.device:
        """Where every tensor handed to a collective lives: the trainer's device under NCCL, the
        CPU under gloo (``workers.training.collectives``)."""
        return collective_device(self.dist_backend, self.device)

    @dispatch(Dispatch.ALL_RANKS)
    def init_process_group(self, master_port: int, master_addr: str = "127.0.0.1") -> bool:
        """Join the model's data-parallel group (every rank; ``ModelActors.join`` gives each the
        same address)."""
        if self.world_size > 1:
            os.environ["MASTER_ADDR"] = master_addr
            os.environ["MASTER_PORT"] = str(master_port)
            dist.init_process_group(self.dist_backend, rank=self.rank, world_size=self.world_size)
        return True

    # -- scoring --------------------------------------------------------------------

    def _prompt_ids(self, prompt: str) -> list[int]:
        """This model's rendering of ``prompt`` (its chat template, ``workers.rollout.chat``), as ids:
        own and grafted responses alike are trained under the receiver's own rendering."""
        ids = prompt_ids(self.tokenizer, prompt, self.settings.chat_template)
        if not ids:
            raise ValueError(f"prompt {prompt!r} tokenises to nothing")
        return ids

    def _logprobs(self, rows: StepRecord) -> tuple[torch.Tensor, torch.Tensor]:
        """Response-aligned log-probs and mask, [B, R]: rows sharing a prompt share its prefix
        forward, and the LM head runs in chunks (``workers.training.logprobs.row_logprobs``). The forward
        runs under the precision's autocast (``bf16-mixed``); the log-probs are fp32 whatever the
        precision (the logits are cast before the log-softmax). Under gradient checkpointing every
        forward runs each row's prompt itself (a checkpointed model in training mode makes no KV
        cache, ``workers.training.checkpointing``), as does an update's where ``update_shares_prompts`` is false."""
        share = self.settings.share_prompts and not self.settings.gradient_checkpointing and (
            self.update_shares_prompts or not torch.is_grad_enabled())
        with self.precision.autocast(self.device):
            return row_logprobs(self.model, rows, self.tokenizer.pad_token_id, self.device,
                                self.settings.logprob_chunk_tokens, share)

    def _micro_batches(self, rows: StepRecord, default_count: int, shared: bool = True) -> list[list[int]]:
        """Row indices in micro-batches: packed by tokens (``max_tokens_per_micro_batch``, a rank's
        forward: where the ranks share each micro-batch, each taking every world_size-th row, as in
        the update, the rows of the rank that takes the most; ``shared`` False: each rank runs every
        row, as in scoring), else ``default_count`` near-equal slices."""
        if self.settings.max_tokens_per_micro_batch is not None:
            lengths = [len(p) + len(r) for p, r in zip(rows["prompt_ids"], rows["response_ids"], strict=True)]
            ranks = self.world_size if shared else 1
            return pack_by_tokens(lengths, self.settings.max_tokens_per_micro_batch, ranks)
        return [chunk.tolist() for chunk in np.array_split(np.arange(len(rows)), min(default_count, len(rows)))]

    @dispatch(Dispatch.ALL_RANKS)
    def score_rows(self, rows: StepRecord) -> list[torch.Tensor]:
        """Per-row token log-probs of each response (``rows``: token rows,
        ``workers.receiver.retokenize.token_rows``) under the current weights (no gradient),
        on the CPU, in token-budget (or ``SCORE_ROWS``-row) forwards of one rank's budget, not the
        world size's: ``score`` / ``score_peers`` hand each rank its share of the rows
        (:meth:`_score_share`), the scoring inside ``train`` every rank all of its rows. With LoRA, with the
        adapters' dropout off (as in the generation replicas)."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        if not len(rows):
            return []
        count = -(-len(rows) // SCORE_ROWS)
        scoring = contextlib.nullcontext() if self.adapters is None else self.adapters.scoring()
        with torch.no_grad(), scoring:
            for micro in self._micro_batches(rows, count, shared=False):
                chunk = rows.select(micro)
                logp = self._logprobs(chunk)[0].float().cpu()
                for b, (i, response) in enumerate(zip(micro, chunk["response_ids"], strict=True)):
                    out[i] = logp[b, : len(response)].clone()
        return out  # type: ignore[return-value]

    def _score_share(self, rows: StepRecord) -> list[torch.Tensor]:
        """This rank's share of ``rows`` (``workers.training.rank_share``) scored (:meth:`score_rows`)."""
        return self.score_rows(rows.select(list(range(len(rows)))[rank_share(len(rows), self.rank, self.world_size)]))

    @dispatch(Dispatch.EACH_RANK)
    def score(self, rows: StepRecord, as_refs: bool = False) -> dict[str, list]:
        """pi_old of this model's own responses (rows of the step's record: ``prompt``,
        ``token_ids``) under the current, pre-update weights: ``old_logp``, each response's token
        log-probs (float32), and ``mean_logp``, their mean (Eq. 6, the gate's source side), of
        this rank's share of the rows (all of them with one rank; the driver concatenates the
        ranks' answers). The ``recompute`` path of ``workers.training.sampling_logprobs``; nothing
        is kept here. ``as_refs``: ``old_logp`` stays in the object store, one ``TokenRef`` per
        row, for ``train`` (``workers.training.token_refs``: the driver passes them on unopened)."""
        keys = list(zip(rows["prompt_id"], rows["sample"], strict=True))
        if len(set(keys)) != len(keys):
            raise ValueError("a rollout batch must hold each (prompt, sample) once")
        ids = {p: self._prompt_ids(p) for p in dict.fromkeys(rows["prompt"])}
        logps = self._score_share(token_rows([ids[p] for p in rows["prompt"]], rows["token_ids"]))
        old = [lp.numpy() for lp in logps]
        return {"old_logp": put_rows(old) if as_refs else old,
                "mean_logp": [float(lp.mean()) if lp.numel() else float("nan") for lp in logps]}

    @dispatch(Dispatch.EACH_RANK)
    def score_peers(self, rows: StepRecord, as_refs: bool = False) -> dict[str, list]:
        """The gate's receiver side (Eq. 7) for peer responses (``prompt``, ``response``, ``finished``), each
        re-tokenised by this model and scored under the old weights: ``logp`` (float32; a routed response's pi_old,
        Eq. 9) and ``mean`` (-inf: empty; NaN: past the budget, ``retokenize.budgeted_rows``), as :meth:`score`'s."""
        ends = zip(rows["prompt"], rows["response"], rows["finished"], strict=True)
        pairs = [(self._prompt_ids(p), retokenize(self.tokenizer, r, f, self.end_id)) for p, r, f in ends]
        scored, past = budgeted_rows(pairs, self.settings.max_tokens_per_micro_batch)
        mine = rank_share(len(rows), self.rank, self.world_size)
        logps = [torch.full((len(r),), float("nan")) if x else lp
                 for lp, (_, r), x in zip(self._score_share(scored), pairs[mine], past[mine], strict=True)]
        arrays = [lp.numpy() for lp in logps]
        return {"logp": put_rows(arrays) if as_refs else arrays,
                "mean": [float(lp.mean()) if lp.numel() else float("-inf") for lp in logps]}

    @dispatch(Dispatch.RANK0)
    def answer_starts(self, rows: StepRecord) -> list[int]:
        """For the kinds that read a donor's tokens (``RowKind.donor_tokens``): how many of each of this
        model's responses' tokens (``token_ids``; text: special tokens skipped) precede its final ``\\boxed{``."""
        return [answer_start(self.tokenizer, ids, text, skip_special_tokens=True)
                for ids, text in zip(rows["token_ids"], rows["response"], strict=True)]

    # -- the update -----------------------------------------------------------------

    @dispatch(Dispatch.ALL_RANKS)
    def train(self, batch: StepRecord, objective: ObjectiveSpec | None = None) -> TrainResult:
        """Add the training columns to ``batch`` (this receiver's rows of the train record; each
        row kind's ``add``, ``workers.receiver.kinds``: own groups not replaced, gated grafts,
        added peer groups, SGT items), order the trained rows into minibatches (``exchange.peer_placement``,
        ``algorithm.minibatch_split``) and run the minibatch updates of ``objective`` (None: the
        token-level Eq. 10). Own rows' pi_old is the batch's ``old_logp`` when it is recomputed.
        Returns the metrics, the updates and the batch's outcome columns. Own rows' ``old_logp``
        and ``receiver_logp`` may be ``TokenRef``s of its scoring passes (fetched here), as a donor's
        ``old_logp`` on the rows of kinds that read it (``RowKind.donor_tokens``)."""
        t0 = time.perf_counter()
        reads = [r for r, kind in enumerate(batch["kind"]) if kind == OWN or ROW_KINDS.get(kind).donor_tokens]
        batch = resolve(resolve(batch, "old_logp", reads), "receiver_logp")
        own_prompts = [batch["prompt_id"][rows[0]] for rows in groups_of(batch, OWN)]
        if len(set(own_prompts)) != len(own_prompts):
            raise ValueError("a rollout batch must hold each prompt once (groups are keyed by prompt_id)")
        if self.takes_old_logp and any(batch.get("old_logp")[r] is None for r in batch.where(kind=OWN)):
            raise RuntimeError("pi_old is not sg(pi_theta) here (algorithm.old_logprobs, minibatches x epochs > 1, "
                               "run.async): the batch's own rows need their old_logp (score them first)")
        loss_fn = self.token_objective if objective is None else make_objective(objective.name, objective.params)
        for name in dict.fromkeys(batch["kind"]):  # a kind this rank does not know fails, named, never goes untrained
            ROW_KINDS.get(name)
        kinds = kinds_in_order()
        extra = {name: default for kind in kinds for name, (default, _) in kind.outcome_columns.items()}
        rows = ReceiverBatch(batch, outcome_defaults=extra)
        view = TrainerView(self.tokenizer, self._prompt_ids, self.score_rows, self.transfer, self.takes_old_logp,
                           self.end_id, self.settings.max_tokens_per_micro_batch)
        for kind in kinds:  # own rows first: a graft replaces an own group, SGT joins one
            kind.add(rows, view)
        t_score = time.perf_counter() - t0

        training = rows.training()  # the trained rows' columns, in training order
        slots = sum(1 for slot in rows["slot"] if slot >= 0)
        peer_out = torch.zeros((slots, 2), dtype=torch.float64)  # s, weight of each peer row at its update
        stats, order, first_update = self._update(training, rows.group_is_peer, loss_fn, peer_out)
        self.version += 1
        for r, update in zip(training["row"], first_update, strict=True):
            rows["update"][r] = update
        for kind in kinds:
            kind.after_update(rows, peer_out)
        # the rows' weights as trained: a HACPO peer's is known only at its update (after_update)
        metrics = {**stats, **rows.tally.metrics(), **peer_push(rows.training(), POLICY)}
        timings = {"score": t_score, "train": time.perf_counter() - t0 - t_score}
        return TrainResult(metrics, self.version, timings, order, rows.outcomes((*OUTCOMES, *extra)))

    # -- backend hooks ----------------------------------------------------------------

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def _grads(self) -> list[torch.Tensor | None]:
        """This rank's gradient, one tensor per trained parameter (None: none yet), as it is."""
        return [p.grad for p in self.params]

    def _grad_snapshot(self) -> list[torch.Tensor | None] | None:
        """A copy of this rank's accumulated gradient, per parameter, on its device (None: the
        backend keeps it out of reach, e.g. ZeRO partitions): the own part of a mixed update's
        gradient (``workers.training.diagnostics.grad_parts``)."""
        return [None if g is None else g.detach().clone() for g in self._grads()]

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _reduce_gradients(self) -> None:
        """Sum the ranks' gradients in place, on the device (each rank's loss: its share of the mean)."""
        if self.world_size > 1:
            for param in self.params:
                if param.grad is not None:
                    all_reduce(param.grad, self.collective_device)

    def _optimizer_step(self) -> float:
        """Clip the summed gradient and step unless its norm is not finite (DeepSpeed's rule too); returns the norm."""
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.settings.grad_clip))
        if math.isfinite(norm):  # the same on every rank: the gradient is summed over ranks first
            self.optimizer.step()
        return norm

    # -- weights and checkpoints ----------------------------------------------------

    @dispatch(Dispatch.RANK0)
    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights, on the CPU (what tests compare; with LoRA the adapted model's,
        base and adapters, under peft's module names)."""
        return {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}

    def _synced(self) -> dict[str, torch.Tensor]:
        """What a weight sync sends, as it is on its device: the full weights, or with LoRA the
        adapter weights only (the replicas hold the same frozen base)."""
        if self.adapters is not None:
            return self.adapters.state()
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    @dispatch(Dispatch.EACH_RANK)
    def weights_for_sync(self) -> dict[str, torch.Tensor] | None:
        """Called on every rank (a sharded backend gathers collectively); rank 0 returns the
        weights that go to the generation replicas (all, or with LoRA the adapters), on the CPU
        in their dtype, the other ranks ``None``."""
        if self.rank != 0:
            return None
        return host_copies(self._synced(), None if self.adapters is not None else self.sync_dtype)  # cast, then copied

    def _in_sync_dtype(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Floating-point weights cast to what a weight sync sends (``sync_dtype``: an hf replica's
        own dtype, a vllm replica's ``resolve_sync_dtype``; a no-op when they match), others (integer buffers) as they are. LoRA adapters go as they
        are: peft keeps them in fp32 over a bf16 base, in the trainer and the replicas alike."""
        if self.adapters is not None:
            return weights
        return {k: v.to(self.sync_dtype) if v.is_floating_point() else v for k, v in weights.items()}

    def _sync_source(self) -> dict[str, torch.Tensor] | None:
        """Rank 0: the weights on their device, in the replicas' dtype (no copy where the dtypes
        match); others None."""
        if self.rank != 0:
            return None
        return self._in_sync_dtype(self._synced())

    @dispatch(Dispatch.RANK0)
    def get_version(self) -> int:
        return self.version

    @dispatch(Dispatch.ALL_RANKS)
    def export(self, folder: str | Path) -> str:
        """Save weights + tokenizer as a transformers folder (what ``eval`` and users load), the
        weights in ``export_dtype`` (auto: the compute dtype; ``workers.model_export``). Called on
        every rank; rank 0 writes."""
        if self.rank != 0:
            return str(folder)
        dtype = resolve_export_dtype(self.settings.export_dtype, self.precision.compute or self.precision.weights)
        if self.adapters is not None:  # the merged model, and the adapters in folder/adapter
            self.adapters.export(folder, dtype)
        else:
            save_model(self.model, folder, dtype)
        self.tokenizer.save_pretrained(str(folder))
        return str(folder)

    @dispatch(Dispatch.ALL_RANKS)
    def save(self, folder: str | Path) -> None:
        """Weights as kept (``bf16-mixed``: the fp32 masters; with LoRA the adapter weights
        only: the base is the model's path, unchanged), optimizer, version and RNG states: what
        a resume needs to continue exactly."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = self._synced() if self.adapters is not None else self.model.state_dict()
        torch.save({"model": weights, "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "rng": self.rng.bit_generator.state,
                    **torch_rng_states(self.device)}, folder / f"trainer_rank{self.rank}.pt")

    @dispatch(Dispatch.ALL_RANKS)
    def load(self, folder: str | Path) -> int:
        """What :meth:`save` wrote, read onto the host and copied into the live weights; the old
        optimizer state is dropped before the loaded one goes to the device. A GPU never holds
        two copies: left where ``torch.save`` found them (the GPU), a 3 B model's fp32 weights
        and AdamW state (36 GB) would arrive beside the live ones (48 GB) on an 80 GB card."""
        state = torch.load(Path(folder) / f"trainer_rank{self.rank}.pt", map_location="cpu", weights_only=False)
        if self.adapters is not None:
            self.adapters.load(state["model"].items())
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.state.clear()
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.rng.bit_generator.state = state["rng"]
        restore_torch_rng(state, self.device)
        return self.version
