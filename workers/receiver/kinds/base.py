"""The row-kind interface: which rows of the step's record a route of one kind puts into the
receiver's part of the train record (controller side, through a :class:`TrainBatchBuilder`) and
which columns the receiver's trainer adds to those rows to train them, with which loss term
(trainer side), in one object per kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from graftpool.contracts import ROW_KINDS, Route
from graftpool.step_record import StepRecord
from workers.receiver.peer_transfer import PeerTransfer
from workers.receiver.receiver_batch import ReceiverBatch

PromptIds = Callable[[str], list[int]]
ScoreRows = Callable[[StepRecord], list[torch.Tensor]]


@dataclass(frozen=True)
class TrainerView:
    """What a kind's :meth:`RowKind.add` may use of the receiver's trainer."""

    tokenizer: object
    prompt_ids: PromptIds  # the receiver's own rendering of a prompt, as ids
    score_rows: ScoreRows  # per-row token log-probs of token rows (workers.receiver.retokenize.token_rows), pre-update
    transfer: PeerTransfer  # the gate and the peer advantages (Eqs. 6-8)
    takes_old_logp: bool  # own rows' pi_old is the record's ``old_logp`` (recomputed or behaviour); False: on-policy
    end_id: int  # what ends a finished peer response re-tokenised (workers.receiver.retokenize.response_end_id)
    # models[].trainer.max_tokens_per_micro_batch: a peer row longer than this is neither scored nor trained
    # (workers.receiver.retokenize.over_budget); None: no budget
    max_row_tokens: int | None = None


class TrainBatchBuilder:
    """The train record of one step under construction (controller side): rows of the step's
    record, each receiver's own rows first and then what each route gives it in route order,
    with the columns of ``graftpool.step_record.ROUTED`` and the advantage each row is trained
    with (the record's, or the route's)."""

    def __init__(self, record: StepRecord, receivers: Sequence[str]):
        self.record = record
        self.parts: dict[str, dict[str, list]] = {
            name: {"index": [], "kind": [], "group": [], "advantage": []} for name in receivers}

    def new_group(self, receiver: str) -> int:
        """A new group index in ``receiver``'s batch."""
        groups = self.parts[receiver]["group"]
        return max(groups) + 1 if groups else 0

    def add_rows(self, receiver: str, kind: str, rows: Sequence[int], group: int | None = None,
                 advantages: Sequence[float] | None = None) -> int:
        """Rows of the step's record into ``receiver``'s batch as ``kind``, in one group (a new one
        unless ``group`` is given), each with the advantage given or its own. Returns the group."""
        part = self.parts[receiver]
        group = self.new_group(receiver) if group is None else group
        for i, r in enumerate(rows):
            part["index"].append(r)
            part["kind"].append(kind)
            part["group"].append(group)
            part["advantage"].append(float(self.record["advantage"][r] if advantages is None else advantages[i]))
        return group

    def positions(self, receiver: str, kind: str, prompt_id: str) -> list[int]:
        """Where the rows of ``kind`` on ``prompt_id`` sit in ``receiver``'s batch so far."""
        part = self.parts[receiver]
        return [j for j, (r, k) in enumerate(zip(part["index"], part["kind"], strict=True))
                if k == kind and self.record["prompt_id"][r] == prompt_id]

    def reweight(self, receiver: str, kind: str, prompt_id: str, advantages: Sequence[float]) -> None:
        """New advantages for the rows of ``kind`` on ``prompt_id`` already in ``receiver``'s batch."""
        positions = self.positions(receiver, kind, prompt_id)
        for j, advantage in zip(positions, advantages, strict=True):
            self.parts[receiver]["advantage"][j] = float(advantage)

    def build(self) -> StepRecord:
        """The train record: each receiver's rows in turn (receivers in the given order)."""
        index, cols = [], {"receiver": [], "kind": [], "group": [], "advantage": []}
        for receiver, part in self.parts.items():
            index += part["index"]
            cols["receiver"] += [receiver] * len(part["index"])
            for name in ("kind", "group", "advantage"):
                cols[name] += part[name]
        rows = self.record.select(index)
        return rows.with_columns(source_model=rows["model"], **cols)


class RowKind:
    """One route kind. ``order``: where its rows come in the training batch and the store (own
    first: later kinds may join the own groups, as SGT does). Subclass it in a module of
    ``workers/receiver/kinds/`` and :func:`register_kind` an instance."""

    name: str = ""
    order: int = 0
    replaces_own: bool = False  # the receiver's own group on the prompt is not trained (a graft)
    has_compat: bool = False  # its rows carry a compatibility (the gate's s, or a cross ratio)
    # its rows read the donor's own tokens: its per-token log-probs (the record's ``old_logp``, fetched
    # by the receiver's trainer) and its answer start (``answer_start``, counted by the donor's)
    donor_tokens: bool = False
    # outcome columns of its own beyond graftpool.step_record.OUTCOMES: name -> (the value of a row
    # that does not set it, its Arrow type, e.g. "double"); the trainer returns them for every row
    # and the store writes them with that type, so a step where no row sets one still reads back
    # with the steps where some do
    outcome_columns: dict[str, tuple[object, str]] = {}

    def plan(self, batch: TrainBatchBuilder, route: Route, donor_rows: list[int], receiver: str) -> None:
        """Controller side: the rows ``route`` gives ``receiver`` (``donor_rows``: the donor's
        group on the prompt, rows of the step's record), added to ``batch``."""
        raise NotImplementedError

    def add(self, rows: ReceiverBatch, view: TrainerView) -> None:
        """Trainer side: the training columns of this kind's rows that are trained
        (:meth:`ReceiverBatch.train`, in training groups it opens or joins) and the outcome
        columns of all its rows."""
        raise NotImplementedError

    def loss(self, logp: torch.Tensor, mask: torch.Tensor, rows: StepRecord, settings) -> torch.Tensor:
        """Trainer side, for the rows this kind trains with its own loss term (``term`` = its
        name, :meth:`ReceiverBatch.train`): the term's mean over ``rows`` (one micro-batch's, on
        this rank; ``logp``/``mask`` [B, R] response-aligned; ``settings``: the trainer's
        ``TrainerSettings``). The update weighs it by the rows' share of the minibatch's rows of
        the term, so that micro-batches and ranks add up to the minibatch's mean."""
        raise NotImplementedError(f"row kind {self.name!r} trains no rows with a loss term of its own")

    def after_update(self, rows: ReceiverBatch, peer_out: torch.Tensor) -> None:
        """Trainer side, after the updates: outcomes known only then (``peer_out``: each peer
        slot's s and weight at its update)."""

    def received(self, batch: StepRecord, failed: set[str]) -> int:
        """How many of this kind's groups count as received for ``exchange/received`` (``batch``:
        one receiver's rows of the train record; ``failed``: its all-fail prompt ids)."""
        return 0

    def step_metrics(self, batch: StepRecord) -> dict[str, float]:
        """This kind's own per-step metrics."""
        return {}


def register_kind(kind: RowKind) -> RowKind:
    return ROW_KINDS.register(kind.name)(kind)


def kinds_in_order() -> list[RowKind]:
    """Every registered kind, in batch order."""
    return sorted((ROW_KINDS.get(name) for name in ROW_KINDS.names()), key=lambda kind: kind.order)


def groups_of(batch: StepRecord, kind: str) -> list[list[int]]:
    """The rows of each group of ``kind`` in a receiver's batch, group by group, in batch order."""
    return list(batch.group_rows("group", rows=batch.where(kind=kind)).values())
