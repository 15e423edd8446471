"""The minibatch updates of one training step (docs/algorithm.md section 2, "Peer-last updates"): the
receiver's rows cut into minibatches (``workers.receiver.minibatch``), one optimizer step per
minibatch over ``grad_accum`` micro-batches, the objective's loss (Eq. 10, or the SGT term)
on each, and per-update statistics.

:class:`MinibatchUpdates` is a base class of the trainers. What it reads from the trainer:
its ``settings`` (``workers.training.settings.TrainerSettings``: epochs, minibatches,
peer_placement, minibatch_split, grad_accum, sgt_coef, grad_parts), ``rng``, ``rank``, ``world_size``,
``device``, ``collective_device`` (``workers.training.collectives``: every tensor handed to a
collective lives there), and the hooks every backend provides:
``_logprobs``, ``_micro_batches``, ``_zero_grad``, ``_grad_snapshot``, ``_grads``, ``_backward``,
``_reduce_gradients``, ``_optimizer_step``.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from graftpool.step_record import StepRecord
from workers.receiver.kinds import ROW_KINDS
from workers.receiver.minibatch import minibatch_rows
from workers.receiver.objective import Objective, RowConstants, StepTokens
from workers.receiver.receiver_batch import POLICY
from workers.training.batching import scatter_old_logp
from workers.training.collectives import all_reduce, all_reduce_to_host
from workers.training.diagnostics import grad_parts, update_metrics
from workers.training.train_result import Update


def not_trained(peer_out: torch.Tensor, slots: list[int]) -> None:
    """The peer rows at ``slots`` (-1: not a peer row) took no update: s NaN, weight 0 (so
    ``exchange/peer_push`` and the store's ``weight`` leave them out)."""
    for slot in slots:
        if slot >= 0:
            peer_out[slot] = torch.tensor([float("nan"), 0.0])


class MinibatchUpdates:
    """The update loop shared by the trainer backends (see the module docstring)."""

    def _update(self, rows: StepRecord, group_is_peer: list[bool], objective: Objective,
                peer_out: torch.Tensor) -> tuple[dict[str, float], list[Update], list[int]]:
        """One optimizer step per minibatch, over ``grad_accum`` micro-batches whose losses add
        up to the minibatch's loss (its ``objective.normaliser``). A micro-batch whose loss is not
        finite (on any rank) is skipped and counted; a minibatch with no finite micro-batch takes
        no step, nor one whose summed gradient's norm is not finite (counted apart). In a minibatch with own and peer rows, the own rows' micro-batches run first and
        the gradient is snapshot in between (on its device; ``grad_parts`` off: not at all), so each
        update reports the own and peer parts of its gradient. Peer rows' s and weight of the last
        epoch go to ``peer_out`` (a skipped micro-batch's, and a minibatch's whose step was not taken:
        NaN and 0). A row's first update is the first whose step took its micro-batch's gradient (a
        skipped micro-batch's rows: not that update's). ``rows``: the trained rows' columns in training order
        (``workers.receiver.receiver_batch.ReceiverBatch.training``); a row's ``term`` says which
        loss trains it: the objective (``POLICY``) or its kind's ``loss``. Returns the metrics,
        the updates taken, in order, and each row's first update (-1: none). Counts stay on the
        host until they are summed over ranks (``workers.training.collectives.all_reduce_to_host``)."""
        # own clipped, own units, peer clipped, peer units (the objective's: tokens or rows), loss, steps
        totals = torch.zeros(6, dtype=torch.float64)
        skipped, nonfinite_steps = 0, 0
        order: list[tuple[str, int, int]] = []
        update_stats: list[list[float]] = []  # loss, grad norm, own part's norm, peer part's norm
        group_rows: list[list[int]] = [[] for _ in group_is_peer]
        for i, group in enumerate(rows["train_group"]):
            group_rows[group].append(i)
        lengths = [len(r) for r in rows["response_ids"]]
        policy = [term == POLICY for term in rows["term"]]
        first_update = [-1] * len(rows)
        s = self.settings
        update = 0  # m: the optimizer update's index in the step, counted on through its epochs
        for _ in range(s.epochs):
            peer_out.fill_(0.0)  # each rank writes the slots it trains; summed over ranks below
            minibatches = minibatch_rows(group_rows, group_is_peer, s.minibatches, s.peer_placement, self.rng,
                                         s.minibatch_split)
            step = StepTokens(sum(n for n, p in zip(lengths, policy, strict=True) if p), len(minibatches))
            for mb in minibatches:
                mb_rows = rows.select(mb)
                normaliser = objective.normaliser([lengths[i] for i in mb if policy[i]],
                                                  [rows["prompt_id"][i] for i in mb if policy[i]], step)
                own_part = [i for i in mb if not rows["peer"][i]]
                peer_part = [i for i in mb if rows["peer"][i]]
                parts = [own_part, peer_part] if own_part and peer_part else [mb]
                self._zero_grad()
                good, loss_sum, own_grad = 0, 0.0, None
                untrained: set[int] = set()  # rows of the minibatch's skipped micro-batches
                for part in parts:
                    if part is peer_part and len(parts) == 2 and s.grad_parts:
                        own_grad = self._grad_snapshot()  # the own rows' gradient, before the peer rows'
                    part_rows = rows.select(part)
                    for micro in self._micro_batches(part_rows, s.grad_accum):
                        loss, clip_counts = self._micro_loss(part_rows.select(micro), mb_rows, objective, update,
                                                             normaliser, peer_out)
                        totals[:4] += clip_counts
                        finite = bool(torch.isfinite(loss.detach()))
                        if self.world_size > 1:
                            flag = torch.tensor([float(finite)])
                            finite = bool(all_reduce_to_host(flag, self.collective_device, "min")[0])
                        if not finite:
                            skipped += 1  # a NaN/inf loss never reaches the weights
                            untrained.update(part[j] for j in micro)
                            not_trained(peer_out, part_rows.select(micro)["slot"])  # its peer rows: no s, no weight
                            continue
                        self._backward(loss)
                        good += 1
                        loss_sum += float(loss.detach())
                if good:
                    norms = self._step_with_parts(own_grad, bool(peer_part), bool(own_part))
                    if not math.isfinite(norms[0]):  # no step taken (either backend): not an update
                        nonfinite_steps += 1  # every rank alike (the norm is of the summed gradient)
                        not_trained(peer_out, mb_rows["slot"])  # its peer rows: as a skipped micro-batch's
                        update += 1
                        continue
                    totals[4] += loss_sum
                    totals[5] += 1
                    taken = [i for i in mb if i not in untrained]  # a skipped micro-batch's rows: not this update's
                    for i in taken:
                        first_update[i] = len(order) if first_update[i] < 0 else first_update[i]
                    kind = "mixed" if own_part and peer_part else "peer" if peer_part else "own"
                    order.append((kind, len(taken), sum(lengths[i] for i in taken)))
                    update_stats.append([loss_sum, *norms])
                update += 1
        stats = torch.tensor(update_stats, dtype=torch.float64).reshape(-1, 4)
        if self.world_size > 1:
            device = self.collective_device
            totals = all_reduce_to_host(totals, device)
            peer_out.copy_(all_reduce_to_host(peer_out, device))
            stats[:, 0] = all_reduce_to_host(stats[:, 0], device)  # each rank's loss is its share of the minibatch's
            totals[5] /= self.world_size  # every rank counted the same steps
        own_units, peer_units = totals[1].item(), totals[3].item()
        updates = [Update(kind, n_rows, float(loss), tokens, norm, own_norm, peer_norm)
                   for (kind, n_rows, tokens), (loss, norm, own_norm, peer_norm)
                   in zip(order, stats.tolist(), strict=True)]
        return {
            "train/loss": totals[4].item() / max(totals[5].item(), 1.0),
            "train/own_clip_frac": totals[0].item() / own_units if own_units else 0.0,
            "train/peer_clip_frac": totals[2].item() / peer_units if peer_units else float("nan"),
            "train/own_tokens": float(sum(n for n, peer in zip(lengths, rows["peer"], strict=True) if not peer)),
            "train/peer_tokens": float(sum(n for n, peer, p in zip(lengths, rows["peer"], policy, strict=True)
                                           if peer and p)),
            "train/grad_norm": float(np.mean([u.grad_norm for u in updates])) if updates else float("nan"),
            "train/skipped_updates": float(skipped),
            "train/nonfinite_grad_steps": float(nonfinite_steps),
            "train/updates": float(len(order)),
            **update_metrics(updates),
        }, updates, first_update

    def _step_with_parts(self, own_grad: list[torch.Tensor | None] | None, has_peer: bool,
                         has_own: bool) -> list[float]:
        """The optimizer step, and [norm, own part's norm, peer part's norm] of its gradient before
        clipping (summed over ranks). ``own_grad``: this rank's gradient after the own rows alone
        (a mixed minibatch with ``grad_parts`` on: a snapshot on the device, one tensor per
        parameter), None otherwise. The split is computed on the device from norms
        (``workers.training.diagnostics.grad_parts``): two floats come back to the host."""
        self._reduce_gradients()
        parts = None
        if own_grad is not None:
            present = [t for t in own_grad if t is not None]
            if self.world_size > 1 and present:  # the own part summed over ranks: one flat collective
                flat = torch.cat([t.reshape(-1) for t in present])
                all_reduce(flat, self.collective_device)
                for tensor, summed in zip(present, flat.split([t.numel() for t in present]), strict=True):
                    tensor.copy_(summed.view_as(tensor))
            parts = grad_parts(own_grad, self._grads())
        norm = self._optimizer_step()
        if parts is not None:
            return [norm, *parts]
        if self.settings.grad_parts and own_grad is None and (has_peer != has_own):  # the whole gradient is one part's
            return [norm, norm if has_own else 0.0, norm if has_peer else 0.0]
        return [norm, float("nan"), float("nan")]

    def _micro_loss(self, micro_rows: StepRecord, mb_rows: StepRecord, objective: Objective, update: int,
                    normaliser: float, peer_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of one micro-batch's loss, scaled so that summed over micro-batches
        and ranks the gradient equals that of the whole minibatch's loss (``normaliser``): the
        objective's on the rows of the ``POLICY`` term, then each other term (a row kind's
        ``loss``, in the kinds' order) times its rows' share of the minibatch's rows of that term.

        Every rank runs the same forwards, whatever rows it takes: one per loss term the
        micro-batch has rows of. A DeepSpeed ZeRO-3 forward
        gathers the partitioned weights collectively, layer by layer, and its backward again, so
        a rank with one forward more than its peers would pair its gathers with their backward's
        (a hang or a size mismatch). A rank without rows of a term runs the term's first row with
        weight 0: a zero gradient, and the collectives of the others."""
        loss = torch.zeros((), device=self.device)
        counts = torch.zeros(4, dtype=torch.float64)  # host
        terms = dict.fromkeys(sorted(micro_rows["term"], key=lambda term: (term != POLICY, term_order(term))))
        for term in terms:
            term_rows = micro_rows.where(term=term)
            mine = term_rows[self.rank :: self.world_size]
            if not mine:
                loss = loss + self._zero_weight_forward(micro_rows.select(term_rows))
                continue
            rows = micro_rows.select(mine)
            logp, mask = self._logprobs(rows)
            if term != POLICY:
                loss = loss + ROW_KINDS.get(term).loss(logp, mask, rows, self.settings) * (
                    len(mine) / len(mb_rows.where(term=term)))
                continue
            constants = RowConstants(
                torch.tensor([float(a) for a in rows["trained_advantage"]], device=self.device),
                torch.tensor([float(w) for w in rows["weight"]], device=self.device),
                torch.tensor(rows["peer"], device=self.device),
                torch.tensor([float(m) for m in rows["source_mean"]], device=self.device))
            terms_out = objective(logp, scatter_old_logp(rows, logp), mask, constants, update, normaliser)
            loss = loss + terms_out.loss
            counts += terms_out.clip_counts.cpu()
            for b, slot in enumerate(rows["slot"]):
                if slot >= 0:
                    peer_out[slot] = torch.tensor([float(terms_out.ratio[b]), float(terms_out.weight[b])])  # host
        return loss, counts

    def _zero_weight_forward(self, rows: StepRecord) -> torch.Tensor:
        """A forward on ``rows``' first row, times 0: a rank with no rows of a term joins the
        collectives of the ranks that have some (gradient all-reduce; ZeRO-3 parameter gathers)."""
        return self._logprobs(rows.select([0]))[0].sum() * 0.0


def term_order(term: str) -> int:
    """Where a loss term comes in a micro-batch's loss: the objective first, then the kinds' terms
    in their kinds' order."""
    return -1 if term == POLICY else ROW_KINDS.get(term).order
