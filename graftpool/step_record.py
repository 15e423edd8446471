"""One step's responses, column by column, from generation to the update (issue #43).

A :class:`StepRecord` holds one row per response and one list per column, in the spirit of
verl's ``DataProto``. Every phase of a step adds columns to it or selects rows of it; nothing
regroups responses by position or keeps parallel dicts by model:

- generation creates it (:data:`GENERATED`): model, prompt id, sample index, the prompt as the
  model saw it, the response's text, token ids and behaviour log-probs, whether it ended, and
  the version of the weights that sampled it;
- the verifier adds ``reward`` and ``reason``; Eq. 1 adds ``advantage``; the source side of
  the gate adds ``mean_logp`` (Eq. 6) and, unless pi_old is on-policy, ``old_logp`` (per token);
- the exchange selects rows of it into one **train record** (:data:`ROUTED`: the receiver, the
  row's kind, its group in the receiver's batch, the advantage it is trained with);
- each receiver's trainer gets its rows of the train record and returns :data:`OUTCOMES`,
  joined back as columns; the trajectory store and the metrics read the train record.

Rows of one record are ordered: generation's by (model, prompt, sample), the train record's by
receiver and then as routed. No torch and no Ray here: records are pickled into actors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GENERATED = ("model", "prompt_id", "sample", "prompt", "rendered_prompt", "response", "token_ids", "gen_logprobs",
             "finished", "policy_version")
"""What generation writes (``workers.rollout.generation.completion_record`` builds exactly these):
the sampling model, the prompt's id, the sample's index in its group, the prompt text every model
was given, the prompt as this model saw it (its chat template), the response text, its token ids in
the model's tokenizer (EOS included when it finished), the behaviour log-prob of each token (under
the weights that sampled it, temperature 1), whether it ended with EOS, and those weights'
version."""

SCORED = ("reward", "reason", "advantage", "mean_logp", "old_logp")
"""What the controller adds before routing: the verifier's reward and reason, the GRPO advantage
on the full group (Eq. 1), the response's mean log-likelihood under pi_old (Eq. 6; the gate's
source side) and, unless pi_old is ``on_policy``, the per-token ``old_logp`` (the trainers'
pre-update pass under ``recompute``, the behaviour log-probs under ``sampling``;
``orchestrator.controller.exchange.with_source_side``)."""

ROUTED = ("receiver", "kind", "group", "source_model")
"""What a route adds in the train record: the receiver, the row's kind (own, graft, peer, sgt;
``workers.receiver.kinds``), its group index in the receiver's batch (rows of one donor or own
group share it) and the model that sampled it (``model`` of the rollout row; a stored peer's
name for stored donors). The route may also replace ``advantage``. Where the
controller scored routed responses under the receiver before routing (``most_compatible``), it
adds their per-token ``receiver_logp`` too, which the trainer takes as pi_old. On the rows of kinds
that read the donor's tokens (``RowKind.donor_tokens``: graft), the donor's model adds
``answer_start``: how many of the response's tokens come before its final ``\\boxed{``
(``orchestrator.controller.exchange.with_answer_starts``; read by the gate's ln s split,
``workers.receiver.gate_split``, and by ``answer_masked``)."""

OUTCOMES = ("n_tokens", "compat", "weight", "trained_advantage", "update")
"""What a trainer returns for each of its rows: its length in the receiver's tokens, the gate's
s (grafts, Eq. 7) or the cross ratio at its update (peers), its weight w (Eq. 8), the advantage
it was trained with, and the index of the optimizer update that trained it (-1: none). Row kinds
add their own (``RowKind.outcome_columns``): graft rows the three parts of ln s
(``compat_answer``, ``compat_rest``, ``compat_eos``; ``workers.receiver.gate_split``)."""


@dataclass
class StepRecord:
    """Rows of one step, column by column (see the module docstring)."""

    columns: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        lengths = {name: len(values) for name, values in self.columns.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns of different lengths: {lengths}")

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]], names: Sequence[str] | None = None) -> StepRecord:
        """A record of ``rows`` (dicts with the same keys; ``names``: the columns, for no rows)."""
        rows = list(rows)
        names = list(names if names is not None else (rows[0] if rows else ()))
        return cls({name: [row[name] for row in rows] for name in names})

    @classmethod
    def concat(cls, parts: Sequence[StepRecord]) -> StepRecord:
        """The rows of ``parts`` one after the other (every part with the same columns)."""
        parts = [p for p in parts if p.columns]
        if not parts:
            return cls()
        names = list(parts[0].columns)
        for part in parts[1:]:
            if set(part.columns) != set(names):
                raise ValueError(f"cannot concatenate records with columns {sorted(names)} and "
                                 f"{sorted(part.columns)}")
        return cls({name: [v for part in parts for v in part.columns[name]] for name in names})

    def __len__(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0

    def __getitem__(self, name: str) -> list[Any]:
        try:
            return self.columns[name]
        except KeyError:
            raise KeyError(f"the record has no column {name!r}; it has {sorted(self.columns)}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.columns

    def get(self, name: str, default: Any = None) -> list[Any]:
        """A column, or ``default`` repeated once per row where the record lacks it."""
        return self.columns[name] if name in self.columns else [default] * len(self)

    def select(self, rows: Iterable[int]) -> StepRecord:
        """A record of the given rows, in the given order (all columns)."""
        index = list(rows)
        return StepRecord({name: [values[i] for i in index] for name, values in self.columns.items()})

    def with_columns(self, **columns: Sequence[Any]) -> StepRecord:
        """A record with ``columns`` added or replaced (one value per row each)."""
        for name, values in columns.items():
            if len(values) != len(self):
                raise ValueError(f"column {name!r} has {len(values)} values for {len(self)} rows")
        return StepRecord({**self.columns, **{name: list(values) for name, values in columns.items()}})

    def where(self, **equals: Any) -> list[int]:
        """The rows whose columns equal the given values, in record order."""
        cols = [(self[name], value) for name, value in equals.items()]
        return [r for r in range(len(self)) if all(values[r] == value for values, value in cols)]

    def group_rows(self, *keys: str, rows: Iterable[int] | None = None) -> dict[tuple, list[int]]:
        """The rows (all, or ``rows``) grouped by the values of ``keys``, groups in order of first
        appearance, rows in record order."""
        cols = [self[k] for k in keys]
        out: dict[tuple, list[int]] = {}
        for r in (range(len(self)) if rows is None else rows):
            out.setdefault(tuple(c[r] for c in cols), []).append(r)
        return out

    def row(self, r: int) -> dict[str, Any]:
        """Row ``r`` as a dict of its columns."""
        return {name: values[r] for name, values in self.columns.items()}
