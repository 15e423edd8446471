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

import numpy as np
import torch

from workers.receiver.minibatch import minibatch_rows
from workers.receiver.objective import Objective, RowConstants, StepTokens, sgt_loss
from workers.training.batching import TrainRow, scatter_old_logp
from workers.training.collectives import all_reduce, all_reduce_to_host
from workers.training.diagnostics import grad_parts, update_metrics
from workers.training.train_result import Update


class MinibatchUpdates:
    """The update loop shared by the trainer backends (see the module docstring)."""

    def _update(self, rows: list[TrainRow], group_is_peer: list[bool], objective: Objective,
                peer_out: torch.Tensor) -> tuple[dict[str, float], list[Update]]:
        """One optimizer step per minibatch, over ``grad_accum`` micro-batches whose losses add
        up to the minibatch's loss (its ``objective.normaliser``). A micro-batch whose loss is not
        finite (on any rank) is skipped and counted; a minibatch with no finite micro-batch takes
        no step. In a minibatch with own and peer rows, the own rows' micro-batches run first and
        the gradient is snapshot in between (on its device; ``grad_parts`` off: not at all), so each
        update reports the own and peer parts of its gradient. Peer rows' s and weight of the last epoch go to ``peer_out``; each row's
        ``update`` is set to the first update that trained it. Returns the metrics and the
        updates taken, in order. Counts stay on the host until they are summed over ranks
        (``workers.training.collectives.all_reduce_to_host``)."""
        # own clipped, own units, peer clipped, peer units (the objective's: tokens or rows), loss, steps
        totals = torch.zeros(6, dtype=torch.float64)
        skipped = 0
        order: list[tuple[str, int, int]] = []
        update_stats: list[list[float]] = []  # loss, grad norm, own part's norm, peer part's norm
        group_rows: list[list[TrainRow]] = [[] for _ in group_is_peer]
        for row in rows:
            group_rows[row.group].append(row)
        s = self.settings
        for _ in range(s.epochs):
            peer_out.fill_(0.0)  # each rank writes the slots it trains; summed over ranks below
            update = 0  # m: the optimizer update's index in the step's epoch
            minibatches = minibatch_rows(group_rows, group_is_peer, s.minibatches, s.peer_placement, self.rng,
                                         s.minibatch_split)
            step = StepTokens(sum(len(r.response_ids) for r in rows if not r.is_sgt), len(minibatches))
            for mb_rows in minibatches:
                normaliser = objective.normaliser([len(r.response_ids) for r in mb_rows if not r.is_sgt],
                                                  [r.prompt_id for r in mb_rows if not r.is_sgt], step)
                own_part = [r for r in mb_rows if not r.is_peer]
                peer_part = [r for r in mb_rows if r.is_peer]
                parts = [own_part, peer_part] if own_part and peer_part else [mb_rows]
                self._zero_grad()
                good, loss_sum, own_grad = 0, 0.0, None
                for part in parts:
                    if part is peer_part and len(parts) == 2 and s.grad_parts:
                        own_grad = self._grad_snapshot()  # the own rows' gradient, before the peer rows'
                    for micro in self._micro_batches(part, s.grad_accum):
                        loss, clip_counts = self._micro_loss([part[i] for i in micro], mb_rows, objective, update,
                                                             normaliser, peer_out)
                        totals[:4] += clip_counts
                        finite = bool(torch.isfinite(loss.detach()))
                        if self.world_size > 1:
                            flag = torch.tensor([float(finite)])
                            finite = bool(all_reduce_to_host(flag, self.collective_device, "min")[0])
                        if not finite:
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
            "train/own_tokens": float(sum(len(r.response_ids) for r in rows if not r.is_peer)),
            "train/peer_tokens": float(sum(len(r.response_ids) for r in rows if r.is_peer and not r.is_sgt)),
            "train/grad_norm": float(np.mean([u.grad_norm for u in updates])) if updates else float("nan"),
            "train/skipped_updates": float(skipped),
            "train/updates": float(len(order)),
            **update_metrics(updates),
        }, updates

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

    def _micro_loss(self, micro_rows: list[TrainRow], mb_rows: list[TrainRow], objective: Objective, update: int,
                    normaliser: float, peer_out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's share of one micro-batch's loss, scaled so that summed over micro-batches
        and ranks the gradient equals that of the whole minibatch's loss (``normaliser``).

        Every rank runs the same forwards, whatever rows it takes: one for the micro-batch's RL
        rows when it has any, one for its SGT rows when it has any. A DeepSpeed ZeRO-3 forward
        gathers the partitioned weights collectively, layer by layer, and its backward again, so
        a rank with one forward more than its peers would pair its gathers with their backward's
        (a hang or a size mismatch). A rank without rows of a kind runs the kind's first row with
        weight 0: a zero gradient, and the collectives of the others."""
        rl_rows = [r for r in micro_rows if not r.is_sgt]
        sgt_rows = [r for r in micro_rows if r.is_sgt]
        mine_rl = rl_rows[self.rank :: self.world_size]
        mine_sgt = sgt_rows[self.rank :: self.world_size]
        global_sgt = sum(1 for r in mb_rows if r.is_sgt)
        loss = torch.zeros((), device=self.device)
        counts = torch.zeros(4, dtype=torch.float64)  # host
        if mine_rl:
            logp, mask = self._logprobs(mine_rl)
            constants = RowConstants(
                torch.tensor([r.advantage for r in mine_rl], device=self.device),
                torch.tensor([r.weight for r in mine_rl], device=self.device),
                torch.tensor([r.is_peer for r in mine_rl], device=self.device),
                torch.tensor([r.source_mean for r in mine_rl], device=self.device))
            terms = objective(logp, scatter_old_logp(mine_rl, logp), mask, constants, update, normaliser)
            loss = loss + terms.loss
            counts += terms.clip_counts.cpu()
            for b, row in enumerate(mine_rl):
                if row.slot >= 0:
                    peer_out[row.slot] = torch.tensor([float(terms.ratio[b]), float(terms.weight[b])])  # host
        elif rl_rows:
            loss = loss + self._zero_weight_forward(rl_rows)
        if mine_sgt:
            logp, mask = self._logprobs(mine_sgt)
            loss = loss + sgt_loss(logp, mask, self.settings.sgt_coef) * (len(mine_sgt) / global_sgt)
        elif sgt_rows:
            loss = loss + self._zero_weight_forward(sgt_rows)
        return loss, counts

    def _zero_weight_forward(self, rows: list[TrainRow]) -> torch.Tensor:
        """A forward on ``rows``' first row, times 0: a rank with no rows of a kind joins the
        collectives of the ranks that have some (gradient all-reduce; ZeRO-3 parameter gathers)."""
        return self._logprobs(rows[:1])[0].sum() * 0.0
