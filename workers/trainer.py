"""The ``torch`` trainer backend: old log-probs, re-tokenise + score + gate peers, update.

One :class:`TorchTrainer` per data-parallel rank. With ``world_size > 1`` every rank
holds the same weights, computes the same old log-probs and gate (cheap, and it keeps
the ranks in step without a gather), takes every ``world_size``-th response of each
minibatch, and gradients are summed with ``all_reduce`` over gloo, so the update equals
the single-process one: the token mean of Eq. 10 uses the global token count.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from graftpool.contracts import ObjectiveSpec, RolloutGroup
from graftpool.registry import Registry
from workers.batching import TrainRow, retokenize, scatter_old_logp
from workers.chat import prompt_ids
from workers.diagnostics import peer_push, update_metrics
from workers.generation import load_tokenizer
from workers.logprobs import pack_by_tokens, row_logprobs
from workers.lora import Adapters
from workers.minibatch import order_minibatches
from workers.objective import (
    Objective,
    RowConstants,
    StepTokens,
    TokenObjective,
    make_objective,
    sgt_loss,
)
from workers.old_logprobs import recompute_needed
from workers.peer_transfer import PeerTransfer
from workers.precision import GENERATION_DTYPES, precision_for
from workers.receiver_batch import (
    Graft,
    PeerGroup,
    ReceiverBatch,
    SGTItem,
    add_grafts,
    add_own,
    add_peers,
    add_sgt,
)
from workers.train_result import TrainResult, Update
from workers.weight_sync import SyncSource

__all__ = ["Graft", "PeerGroup", "SGTItem", "TorchTrainer", "TrainResult", "Update", "trainer_class"]

SCORE_ROWS = 256
"""Rows per no-grad scoring forward when ``max_tokens_per_micro_batch`` is not set."""


TRAINERS: Registry[type] = Registry("backend", "models[].trainer.backend",
                                    lazy={"deepspeed": "workers.deepspeed_trainer"})
register_trainer = TRAINERS.register
trainer_class = TRAINERS.get  # the trainer backend class registered as a name (torch, deepspeed)


@register_trainer("torch")
class TorchTrainer(SyncSource):
    """A plain torch trainer (AdamW). Backends subclass it and override the hooks
    ``_zero_grad``, ``_backward``, ``_optimizer_step``, ``state_dict``, ``save``/``load``."""

    def __init__(self, path: str | Path, lr: float = 1e-6, betas=(0.9, 0.999), weight_decay: float = 0.01,
                 grad_clip: float = 1.0, eps_low: float = 0.2, eps_high: float = 0.28, delta: float = 0.8,
                 minibatches: int = 4, epochs: int = 1, peer_placement: str = "last", gate: bool = True,
                 sgt_coef: float = 0.1, seed: int = 0, num_threads: int = 1,
                 trust_remote_code: bool = False, rank: int = 0, world_size: int = 1,
                 grad_accum: int = 1, device: str = "cpu", old_logprobs: str = "auto",
                 max_tokens_per_micro_batch: int | None = None, logprob_chunk_tokens: int | None = 1024,
                 share_prompts: bool = True, peer_responses: str = "all", gate_scope: str = "response",
                 peer_advantages: str = "donor", peer_beta: float = 0.5, loss_normalizer: str = "minibatch",
                 peer_ratio: str = "clip", shaping_gamma: float = 0.1, chat_template: str = "auto",
                 precision: str = "auto", sync_dtype: str = "float32", lora: dict | None = None):
        torch.set_num_threads(num_threads)
        torch.manual_seed(seed)
        self.device = torch.device(device)
        # fp32 | bf16-mixed | bf16 (auto: by the device); workers.precision
        self.precision = precision_for(precision, self.device)
        self.sync_dtype = GENERATION_DTYPES[sync_dtype]  # what the generation replicas hold
        self.tokenizer = load_tokenizer(path, trust_remote_code)
        self.model = AutoModelForCausalLM.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        self.precision.cast(self.model.to(self.device))
        # models[].lora (workers.lora): adapters injected into self.model in place, the base frozen
        self.adapters = None if lora is None else Adapters(self.model, lora)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]  # what AdamW updates
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
        self.grad_clip = grad_clip
        self.grad_accum = grad_accum
        self.eps_low, self.eps_high = eps_low, eps_high
        self.minibatches, self.epochs = minibatches, epochs
        self.peer_placement, self.sgt_coef = peer_placement, sgt_coef
        self.transfer = PeerTransfer(delta, gate, peer_responses, gate_scope, peer_advantages, peer_beta)
        self.token_objective = TokenObjective(eps_low, eps_high, loss_normalizer, peer_ratio, shaping_gamma)
        self.rng = np.random.default_rng(seed)
        self.rank, self.world_size = rank, world_size
        self.version = 0
        # own responses' pi_old: from prepare() (recompute), else sg(pi_theta) during the update
        self.recompute_old = recompute_needed(old_logprobs, minibatches, epochs)
        self.max_tokens = max_tokens_per_micro_batch
        self.chunk_tokens = logprob_chunk_tokens
        self.share_prompts = share_prompts
        self.chat_template = chat_template
        self._own_old: dict[tuple[str, int], torch.Tensor] = {}

    # -- distributed set-up ---------------------------------------------------------

    @property
    def dist_backend(self) -> str:
        """NCCL for ranks on a GPU, gloo on CPU."""
        return "nccl" if self.device.type == "cuda" else "gloo"

    def init_process_group(self, master_port: int, master_addr: str = "127.0.0.1") -> bool:
        if self.world_size > 1:
            os.environ["MASTER_ADDR"] = master_addr
            os.environ["MASTER_PORT"] = str(master_port)
            dist.init_process_group(self.dist_backend, rank=self.rank, world_size=self.world_size)
        return True

    # -- scoring --------------------------------------------------------------------

    def _prompt_ids(self, prompt: str) -> list[int]:
        """This model's rendering of ``prompt`` (its chat template, ``workers.chat``), as ids:
        own and grafted responses alike are trained under the receiver's own rendering."""
        ids = prompt_ids(self.tokenizer, prompt, self.chat_template)
        if not ids:
            raise ValueError(f"prompt {prompt!r} tokenises to nothing")
        return ids

    def _logprobs(self, rows: list[TrainRow]) -> tuple[torch.Tensor, torch.Tensor]:
        """Response-aligned log-probs and mask, [B, R]: rows sharing a prompt share its prefix
        forward, and the LM head runs in chunks (``workers.logprobs.row_logprobs``). The forward
        runs under the precision's autocast (``bf16-mixed``); the log-probs are fp32 whatever the
        precision (the logits are cast before the log-softmax)."""
        with self.precision.autocast(self.device):
            return row_logprobs(self.model, rows, self.tokenizer.pad_token_id, self.device, self.chunk_tokens,
                                self.share_prompts)

    def _micro_batches(self, rows: list[TrainRow], default_count: int) -> list[list[int]]:
        """Row indices in micro-batches: packed by tokens (``max_tokens_per_micro_batch``, times
        the data-parallel world size, since each rank takes every world_size-th row), else
        ``default_count`` near-equal slices."""
        if self.max_tokens is not None:
            lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
            return pack_by_tokens(lengths, self.max_tokens * self.world_size)
        return [chunk.tolist() for chunk in np.array_split(np.arange(len(rows)), min(default_count, len(rows)))]

    def score_rows(self, rows: list[TrainRow]) -> list[torch.Tensor]:
        """Per-row token log-probs of each response under the current weights (no gradient),
        on the CPU, in token-budget (or ``SCORE_ROWS``-row) forwards. With LoRA, with the
        adapters' dropout off (as in the generation replicas)."""
        out: list[torch.Tensor | None] = [None] * len(rows)
        if not rows:
            return []
        count = -(-len(rows) // SCORE_ROWS)
        scoring = contextlib.nullcontext() if self.adapters is None else self.adapters.scoring()
        with torch.no_grad(), scoring:
            for micro in self._micro_batches(rows, count):
                chunk = [rows[i] for i in micro]
                logp = self._logprobs(chunk)[0].float().cpu()
                for b, (i, row) in enumerate(zip(micro, chunk, strict=True)):
                    out[i] = logp[b, : len(row.response_ids)].clone()
        return out  # type: ignore[return-value]

    @staticmethod
    def _check_unique(groups: list[RolloutGroup]) -> None:
        prompt_ids = [g.prompt_id for g in groups]
        if len(set(prompt_ids)) != len(prompt_ids):
            raise ValueError("a rollout batch must hold each prompt once (groups are keyed by prompt_id)")

    def prepare(self, groups: list[RolloutGroup]) -> list[np.ndarray]:
        """Old log-probs of this model's own responses under the pre-update weights (the
        ``recompute`` path of ``workers.old_logprobs``); returns each response's mean (Eq. 6)."""
        self._own_old.clear()
        self._check_unique(groups)
        rows, keys = [], []
        for group in groups:
            prompt_ids = self._prompt_ids(group.prompt)
            for i, ids in enumerate(group.token_ids):
                rows.append(TrainRow(prompt_ids, list(ids)))
                keys.append((group.prompt_id, i))
        logps = self.score_rows(rows)
        means: dict[str, list[float]] = {}
        for (prompt_id, i), logp in zip(keys, logps, strict=True):
            self._own_old[(prompt_id, i)] = logp
            means.setdefault(prompt_id, []).append(float(logp.mean()) if logp.numel() else float("nan"))
        return [np.array(means.get(g.prompt_id, []), dtype=float) for g in groups]

    def score_responses(self, prompts: list[str], responses: list[str], finished: list[bool]) -> np.ndarray:
        """Mean token log-likelihood of peer strings under the current (old) weights, re-tokenised."""
        rows = [TrainRow(self._prompt_ids(p), retokenize(self.tokenizer, r, f))
                for p, r, f in zip(prompts, responses, finished, strict=True)]
        logps = self.score_rows(rows)
        return np.array([float(lp.mean()) if lp.numel() else float("-inf") for lp in logps])

    # -- the update -----------------------------------------------------------------

    def train(self, own: list[RolloutGroup], grafts: list[Graft], sgt: list[SGTItem],
              peers: list[PeerGroup] | None = None, objective: ObjectiveSpec | None = None) -> TrainResult:
        """Build the receiver batch (own groups not replaced, gated grafts, added peer groups,
        SGT items; ``workers.receiver_batch``), order it peer-last and run the minibatch
        updates of ``objective`` (None: the token-level Eq. 10)."""
        t0 = time.perf_counter()
        self._check_unique(own)
        if self.recompute_old and any(g.token_ids for g in own) and not self._own_old:
            raise RuntimeError("old log-probs are recomputed (algorithm.old_logprobs, minibatches x "
                               "epochs > 1): call prepare() on the step's own groups before train()")
        loss_fn = self.token_objective if objective is None else make_objective(objective.name, objective.params)
        batch = ReceiverBatch()
        add_own(batch, own, {g.group.prompt_id for g in grafts}, self._prompt_ids,
                self._own_old if self.recompute_old else None)
        self._own_old = {}  # this step's; a later train() without prepare() must not reuse them
        add_grafts(batch, grafts, own, self.transfer, self.tokenizer, self._prompt_ids, self.score_rows)
        slots = add_peers(batch, peers or [], self.tokenizer, self._prompt_ids)
        add_sgt(batch, sgt, self.tokenizer, self._prompt_ids)
        t_score = time.perf_counter() - t0

        peer_out = torch.zeros((slots, 2), dtype=torch.float64)  # s, weight of each peer row at its update
        stats, order = self._update(batch.rows, batch.group_is_peer, loss_fn, peer_out)
        self.version += 1
        peer_slots = batch.peer_slots
        peer_ratio = [[float(peer_out[i, 0]) if i >= 0 else float("nan") for i in g] for g in peer_slots]
        peer_weight = [[float(peer_out[i, 1]) if i >= 0 else 0.0 for i in g] for g in peer_slots]
        for peer, ratios, weights in zip(peers or [], peer_ratio, peer_weight, strict=True):
            for advantage, s, weight in zip(peer.advantages, ratios, weights, strict=True):
                batch.tally.add(advantage, True, weight if np.isfinite(s) else 0.0, s)
        metrics = {**stats, **batch.tally.metrics(), **peer_push(batch.rows)}
        timings = {"score": t_score, "train": time.perf_counter() - t0 - t_score}
        return TrainResult(metrics, batch.graft_compat, batch.graft_weight, batch.graft_tokens, self.version,
                           timings, batch.graft_advantage, peer_ratio, peer_weight, batch.peer_tokens, order,
                           *batch.updates())

    def _update(self, rows: list[TrainRow], group_is_peer: list[bool], objective: Objective,
                peer_out: torch.Tensor) -> tuple[dict[str, float], list[Update]]:
        """One optimizer step per minibatch, over ``grad_accum`` micro-batches whose losses add
        up to the minibatch's loss (its ``objective.normaliser``). A micro-batch whose loss is not
        finite (on any rank) is skipped and counted; a minibatch with no finite micro-batch takes
        no step. In a minibatch with own and peer rows, the own rows' micro-batches run first and
        the gradient is read in between, so each update reports the own and peer parts of its
        gradient. Peer rows' s and weight of the last epoch go to ``peer_out``; each row's
        ``update`` is set to the first update that trained it. Returns the metrics and the
        updates taken, in order."""
        # own clipped, own units, peer clipped, peer units (the objective's: tokens or rows), loss, steps
        totals = torch.zeros(6, dtype=torch.float64)
        skipped = 0
        order: list[tuple[str, int, int]] = []
        update_stats: list[list[float]] = []  # loss, grad norm, own part's norm, peer part's norm
        by_group: dict[int, list[TrainRow]] = {}
        for row in rows:
            by_group.setdefault(row.group, []).append(row)
        for _ in range(self.epochs):
            peer_out.fill_(0.0)  # each rank writes the slots it trains; summed over ranks below
            update = 0  # m: the optimizer update's index in the step's epoch
            minibatches = order_minibatches(group_is_peer, self.minibatches, self.peer_placement, self.rng)
            step = StepTokens(sum(len(r.response_ids) for r in rows if not r.is_sgt), len(minibatches))
            for minibatch in minibatches:
                mb_rows = [r for g in minibatch for r in by_group.get(g, [])]
                if not mb_rows:
                    continue
                normaliser = objective.normaliser([len(r.response_ids) for r in mb_rows if not r.is_sgt],
                                                  [r.prompt_id for r in mb_rows if not r.is_sgt], step)
                own_part = [r for r in mb_rows if not r.is_peer]
                peer_part = [r for r in mb_rows if r.is_peer]
                parts = [own_part, peer_part] if own_part and peer_part else [mb_rows]
                self._zero_grad()
                good, loss_sum, own_grad = 0, 0.0, None
                for part in parts:
                    if part is peer_part and len(parts) == 2:
                        own_grad = self._grad_vector()  # the own rows' gradient, before the peer rows'
                    for micro in self._micro_batches(part, self.grad_accum):
                        loss, clip_counts = self._micro_loss([part[i] for i in micro], mb_rows, objective, update,
                                                             normaliser, peer_out)
                        totals[:4] += clip_counts
                        finite = torch.tensor([1.0 if torch.isfinite(loss) else 0.0])
                        if self.world_size > 1:
                            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
                        if finite.item() < 1.0:
                            skipped += 1  # a NaN/inf loss never reaches the weights
                            continue
                        self._backward(loss)
                        good += 1
                        loss_sum += float(loss.detach())
                if good:
                    norms = self._step_with_parts(own_grad, bool(peer_part), bool(own_part))
                    totals[4] += loss_sum
                    totals[5] += 1
                    for row in mb_rows:
                        row.update = len(order) if row.update < 0 else row.update
                    kind = "mixed" if own_part and peer_part else "peer" if peer_part else "own"
                    order.append((kind, len(mb_rows), sum(len(r.response_ids) for r in mb_rows)))
                    update_stats.append([loss_sum, *norms])
                update += 1
        stats = torch.tensor(update_stats, dtype=torch.float64).reshape(-1, 4)
        if self.world_size > 1:
            dist.all_reduce(totals)
            dist.all_reduce(peer_out)
            losses = stats[:, 0].clone()
            dist.all_reduce(losses)  # each rank's loss is its share of the minibatch's
            stats[:, 0] = losses
            totals[5] /= self.world_size  # every rank counted the same steps
        own_units, peer_units = totals[1].item(), totals[3].item()
        updates = [Update(kind, n_rows, float(loss), tokens, norm, own_norm, peer_norm)
                   for (kind, n_rows, tokens), (loss, norm, own_norm, peer_norm)
                   in zip(order, stats.tolist(), strict=True)]
        return {
            "train/loss": totals[4].item() / max(totals[5].item(), 1.0),
            "train/own_clip_frac": totals[0].item() / own_units if own_units else 0.0,
            "train/peer_clip_frac": totals[2].item() / peer_units if peer_units else float("nan"),
            "train/own_tokens": float(sum(len(r.response_ids) for r in rows if not r.is_peer)),
            "train/peer_tokens": float(sum(len(r.response_ids) for r in rows if r.is_peer and not r.is_sgt)),
            "train/grad_norm": float(np.mean([u.grad_norm for u in updates])) if updates else float("nan"),
            "train/skipped_updates": float(skipped),
            "train/updates": float(len(order)),
            **update_metrics(updates),
        }, updates

    def _step_with_parts(self, own_grad: torch.Tensor | None, has_peer: bool, has_own: bool) -> list[float]:
        """The optimizer step, and [norm, own part's norm, peer part's norm] of its gradient before
        clipping (summed over ranks). ``own_grad``: this rank's gradient after the own rows alone
        (a mixed minibatch), None otherwise."""
        total = self._grad_vector()
        if own_grad is not None and total is not None and self.world_size > 1:
            stacked = torch.stack([own_grad, total])
            dist.all_reduce(stacked)
            own_grad, total = stacked[0], stacked[1]
        norm = self._optimizer_step()
        if own_grad is not None and total is not None:
            return [norm, float(own_grad.norm()), float((total - own_grad).norm())]
        if own_grad is None and (has_peer != has_own):  # the whole gradient is one part's
            return [norm, norm if has_own else 0.0, norm if has_peer else 0.0]
        return [norm, float("nan"), float("nan")]

    # -- backend hooks ----------------------------------------------------------------

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)

    def _grad_vector(self) -> torch.Tensor | None:
        """This rank's accumulated gradient as one flat fp32 vector on the CPU (None: the
        backend keeps it out of reach, e.g. ZeRO partitions): read for the own / peer split."""
        grads = [p.grad.detach().reshape(-1).float() for p in self.params if p.grad is not None]
        return torch.cat(grads).cpu() if grads else None

    def _backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def _optimizer_step(self) -> float:
        """Sum the ranks' gradients (each rank's loss is its share of the global token mean),
        clip, step; returns the gradient norm before clipping."""
        if self.world_size > 1:
            for param in self.params:
                if param.grad is not None:
                    dist.all_reduce(param.grad)
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip))
        self.optimizer.step()
        return norm

    def _micro_loss(self, micro_rows: list[TrainRow], mb_rows: list[TrainRow], objective: Objective, update: int,
                    normaliser: float, peer_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of one micro-batch's loss, scaled so that summed over micro-batches
        and ranks the gradient equals that of the whole minibatch's loss (``normaliser``)."""
        rl_rows = [r for r in micro_rows if not r.is_sgt]
        sgt_rows = [r for r in micro_rows if r.is_sgt]
        mine_rl = rl_rows[self.rank :: self.world_size]
        mine_sgt = sgt_rows[self.rank :: self.world_size]
        global_sgt = sum(1 for r in mb_rows if r.is_sgt)
        loss = torch.zeros((), device=self.device)
        counts = torch.zeros(4, dtype=torch.float64)
        if mine_rl:
            logp, mask = self._logprobs(mine_rl)
            constants = RowConstants(
                torch.tensor([r.advantage for r in mine_rl], device=self.device),
                torch.tensor([r.weight for r in mine_rl], device=self.device),
                torch.tensor([r.is_peer for r in mine_rl], device=self.device),
                torch.tensor([r.source_mean for r in mine_rl], device=self.device))
            terms = objective(logp, scatter_old_logp(mine_rl, logp), mask, constants, update, normaliser)
            loss = loss + terms.loss
            counts += terms.clip_counts
            for b, row in enumerate(mine_rl):
                if row.slot >= 0:
                    peer_out[row.slot] = torch.tensor([float(terms.ratio[b]), float(terms.weight[b])])
        if mine_sgt:
            logp, mask = self._logprobs(mine_sgt)
            loss = loss + sgt_loss(logp, mask, self.sgt_coef) * (len(mine_sgt) / global_sgt)
        if not mine_rl and not mine_sgt:
            # a forward on one row with weight 0: this rank joins the collectives of the others
            # (gradient all-reduce; ZeRO-3 parameter gathers) with a zero gradient
            loss = self._logprobs(micro_rows[:1])[0].sum() * 0.0
        return loss, counts

    # -- weights and checkpoints ----------------------------------------------------

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

    def weights_for_sync(self) -> dict[str, torch.Tensor] | None:
        """Called on every rank (a sharded backend gathers collectively); rank 0 returns the
        weights that go to the generation replicas (all, or with LoRA the adapters), on the CPU
        in their dtype, the other ranks ``None``."""
        if self.rank != 0:
            return None
        return self._in_sync_dtype({k: v.cpu().clone() for k, v in self._synced().items()})

    def _in_sync_dtype(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Floating-point weights cast to the generation replicas' dtype (``sync_dtype``; a
        no-op when they match), others (integer buffers) as they are. LoRA adapters go as they
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

    def get_version(self) -> int:
        return self.version

    def export(self, folder: str | Path) -> str:
        """Save weights + tokenizer as a transformers folder (what ``eval`` and users load).
        Called on every rank; rank 0 writes."""
        if self.rank != 0:
            return str(folder)
        if self.adapters is not None:  # the merged model, and the adapters in folder/adapter
            self.adapters.export(folder)
        else:
            self.model.save_pretrained(str(folder))
        self.tokenizer.save_pretrained(str(folder))
        return str(folder)

    def save(self, folder: str | Path) -> None:
        """Weights as kept (``bf16-mixed``: the fp32 masters; with LoRA the adapter weights
        only: the base is the model's path, unchanged), optimizer, version and RNG states: what
        a resume needs to continue exactly."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = self._synced() if self.adapters is not None else self.model.state_dict()
        torch.save({"model": weights, "optimizer": self.optimizer.state_dict(),
                    "version": self.version, "rng": self.rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state()}, folder / f"trainer_rank{self.rank}.pt")

    def load(self, folder: str | Path) -> int:
        state = torch.load(Path(folder) / f"trainer_rank{self.rank}.pt", weights_only=False)
        if self.adapters is not None:
            self.adapters.load(state["model"].items())
        else:
            self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version = int(state["version"])
        self.rng.bit_generator.state = state["rng"]
        torch.set_rng_state(state["torch_rng"])
        return self.version
