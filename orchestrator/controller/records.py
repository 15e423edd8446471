"""The trajectory store's table for one step (``orchestrator.controller.trajectory_store`` holds the
schema), read column by column from the step's train record (``graftpool.step_record``), with
the outcome columns the trainers returned. Every row kind is written the same way."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from graftpool.contracts import OWN
from graftpool.step_record import StepRecord
from orchestrator.controller.trajectory_store import SCHEMA
from workers.receiver.kinds import ROW_KINDS, kinds_in_order


def store_table(step: int, train: StepRecord, task_of: Mapping[str, str]) -> pa.Table:
    """One row per row of the train record: receiver by receiver, each receiver's rows kind by
    kind in the kinds' order (own, graft, peer, sgt; each kind in batch order). ``model`` is the
    receiver; ``rendered_prompt`` the receiver's own rendering of the prompt (what it scored and
    trained every row under); ``trained``: an optimizer update held the row with a non-zero weight
    (a HACPO peer outside [lb_m, 1] is in its update with weight 0). After :data:`SCHEMA`'s
    columns, the outcome columns of the row kinds that bring their own
    (``RowKind.outcome_columns``) the train record holds."""
    receivers = list(dict.fromkeys(train["receiver"]))
    kind_order = {name: ROW_KINDS.get(name).order for name in set(train["kind"])}
    order = sorted(range(len(train)), key=lambda r: (receivers.index(train["receiver"][r]),
                                                     kind_order[train["kind"][r]]))
    rendered = {(train["receiver"][r], train["prompt_id"][r]): train["rendered_prompt"][r] or train["prompt"][r]
                for r in train.where(kind=OWN)}
    has_compat = {name: ROW_KINDS.get(name).has_compat for name in kind_order}

    def col(name: str) -> list:
        return [train[name][r] for r in order]

    weight, update = col("weight"), col("update")
    finished = train.get("finished")  # generation's (graftpool.step_record.GENERATED); null where a record lacks it
    columns = {
        "step": [step] * len(order), "model": col("receiver"), "prompt_id": col("prompt_id"),
        "task": [task_of.get(p, "") for p in col("prompt_id")], "sample": col("sample"), "response": col("response"),
        "n_tokens": col("n_tokens"), "reward": col("reward"), "reason": col("reason"),
        "advantage": [float(a) for a in col("trained_advantage")], "source_model": col("source_model"),
        "kind": col("kind"), "weight": [float(w) for w in weight],
        "compat": [float(train["compat"][r]) if has_compat[train["kind"][r]] else None for r in order],
        "mean_logp": col("mean_logp"), "trained": [u >= 0 and w > 0 for u, w in zip(update, weight, strict=True)],
        "update": update, "policy_version": col("policy_version"), "question": col("prompt"),
        "rendered_prompt": [rendered.get((train["receiver"][r], train["prompt_id"][r]), train["prompt"][r])
                            for r in order],
        "finished": [None if finished[r] is None else bool(finished[r]) for r in order],
    }
    table = pa.Table.from_pydict(columns, schema=SCHEMA)
    types = {name: arrow for kind in kinds_in_order() for name, (_, arrow) in kind.outcome_columns.items()}
    for name, arrow in types.items():
        if name in train:
            table = table.append_column(name, outcome_array(col(name), arrow))
    return table


def outcome_array(values: list, arrow_type: str) -> pa.Array:
    """A kind's outcome column as its declared Arrow type (``RowKind.outcome_columns``): a step
    whose rows all hold the default None is still that type, not Arrow's null type, which a
    dataset over every step's files could not read together with the steps that set it."""
    return pa.array(values, type=pa.type_for_alias(arrow_type))
