"""One receiver's rows for one training step, column by column: the batch format that flows
from the exchange phase through the trainer into the trajectory store and the metrics.

A row is one response the receiver is given: its own (``own``), a grafted donor response
(``graft``, docs/algorithm.md section 2, step 6), a peer response added next to its own group
(``peer``, HACPO) or a supervised peer response (``sgt``); each kind is a module of
``workers/receiver/kinds/``. Rows of one donor group (or of one own group) share a ``group``
index; the gate, the advantages and the minibatch cut work on groups. The controller builds the
batch (:meth:`StepBatch.add_group`, :meth:`StepBatch.add_row`, through the kinds' ``plan``);
the trainer returns per-row outcome columns (:data:`OUTCOME_COLUMNS`, by row position), which
:meth:`StepBatch.with_columns` joins to it for the store and the metrics.

No torch and no Ray here: the batch is pickled into the trainer actors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from graftpool.contracts import OWN, RolloutGroup

ROW_COLUMNS = ("kind", "group", "source_model", "prompt_id", "sample", "prompt", "response", "token_ids",
               "finished", "reward", "advantage", "mean_logp", "policy_version", "reason", "source_tokens")
"""What the controller gives each row: its kind, group index, where it comes from (``source_model``,
``prompt_id``, ``sample``), the prompt and response text, the generator's token ids (own rows;
peer rows are re-tokenised by the receiver), whether the response ended with EOS, its reward,
the advantage the route gives it, the source side of the gate (``mean_logp``, Eq. 6; None: not
scored), the
generating policy's version, the verifier's reason and the response's length in its generator's
tokens."""

OUTCOME_COLUMNS = ("n_tokens", "compat", "weight", "trained_advantage", "update")
"""What the trainer returns for each row: its length in the receiver's tokens, the gate's s
(grafts, Eq. 7) or the cross ratio at its update (peers), its weight w (Eq. 8), the advantage it
was trained with, and the index of the optimizer update that trained it (-1: none)."""


@dataclass
class StepBatch:
    """The rows one receiver trains on in one step (see the module docstring)."""

    receiver: str
    columns: dict[str, list[Any]] = field(default_factory=lambda: {name: [] for name in ROW_COLUMNS})
    groups: int = 0  # group indices handed out so far

    def __len__(self) -> int:
        return len(self.columns["kind"])

    def __getitem__(self, name: str) -> list[Any]:
        return self.columns[name]

    def new_group(self) -> int:
        """A new group index."""
        index, self.groups = self.groups, self.groups + 1
        return index

    def add_row(self, **row: Any) -> None:
        """One row: every column of :data:`ROW_COLUMNS` given, no other."""
        if set(row) != set(ROW_COLUMNS):
            raise ValueError(f"a row needs exactly the columns {ROW_COLUMNS}; missing "
                             f"{sorted(set(ROW_COLUMNS) - set(row))}, unknown {sorted(set(row) - set(ROW_COLUMNS))}")
        for name in ROW_COLUMNS:
            self.columns[name].append(row[name])

    def add_group(self, kind: str, group: RolloutGroup, advantages: Sequence[float] | None = None,
                  source: str | None = None) -> int:
        """Every response of ``group`` as rows of ``kind``, one new group index; ``advantages``
        (None: the group's own GRPO advantages, Eq. 1); ``source``: the donor's name in the
        exchange (None: ``group.model``). Token ids travel with own rows only (a peer's are in
        another tokenizer). Returns the group index."""
        advantages = group.advantages if advantages is None else advantages
        index = self.new_group()
        for i, response in enumerate(group.responses):
            self.add_row(kind=kind, group=index, source_model=source or group.model, prompt_id=group.prompt_id,
                         sample=i, prompt=group.prompt, response=response,
                         token_ids=list(group.token_ids[i]) if kind == OWN else None,
                         finished=bool(group.finished[i]) if group.finished else True,
                         reward=float(group.rewards[i]), advantage=float(advantages[i]),
                         mean_logp=value_at(group.mean_logp, i), policy_version=group.policy_version,
                         reason=group.reasons[i] if group.reasons else "",
                         source_tokens=len(group.token_ids[i]) if group.token_ids else 0)
        return index

    def rows(self, kind: str) -> list[int]:
        """Positions of the rows of ``kind``, in batch order."""
        return [r for r, k in enumerate(self.columns["kind"]) if k == kind]

    def groups_of(self, kind: str) -> Iterator[list[int]]:
        """The row positions of each group of ``kind``, group by group, in batch order."""
        by_group: dict[int, list[int]] = {}
        for r in self.rows(kind):
            by_group.setdefault(self.columns["group"][r], []).append(r)
        yield from by_group.values()

    def with_columns(self, **columns: Sequence[Any]) -> StepBatch:
        """A copy with more columns (each one value per row)."""
        for name, values in columns.items():
            if len(values) != len(self):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(self)} rows")
        return StepBatch(self.receiver, {**self.columns, **{k: list(v) for k, v in columns.items()}}, self.groups)


def value_at(values: Sequence[float] | None, i: int) -> float | None:
    """``values[i]`` as a float; None where there are no values."""
    return None if values is None else float(values[i])
