"""The trajectory store: append-only Parquet, one file per step, written atomically.

One row per response that a model produced or received. Own responses have
``source_model == model``; a grafted response is written under the receiver's ``model``
with the donor as ``source_model``, its gate score ``compat`` (s) and ``weight`` (w).
A row is identified by (step, model, prompt_id, source_model, sample). ``trained`` says
whether the row entered the update (an own group replaced by a graft, and a grafted
response the gate dropped, did not), as reported by the trainer; ``update`` is which of the
step's optimizer updates (minibatches, in the order taken) trained it, so peer-last is
visible in the store. HACPO's peer groups (kind ``peer``) are written the
same way, with the cross ratio s at the response's update as ``compat``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("model", pa.string()),
    ("prompt_id", pa.string()),
    ("task", pa.string()),
    ("sample", pa.int64()),
    ("response", pa.string()),
    ("n_tokens", pa.int64()),
    ("reward", pa.float64()),
    ("reason", pa.string()),
    ("advantage", pa.float64()),
    ("source_model", pa.string()),
    ("kind", pa.string()),  # own | graft | sgt | peer
    ("weight", pa.float64()),
    ("compat", pa.float64()),
    ("mean_logp", pa.float64()),
    ("trained", pa.bool_()),
    ("update", pa.int64()),  # the receiver's optimizer update (0, 1, ... in the step) that trained it; -1: none
    ("policy_version", pa.int64()),
    ("question", pa.string()),  # the prompt every model was given
    ("rendered_prompt", pa.string()),  # what the row's model was conditioned on (its chat template)
    ("finished", pa.bool_()),  # the sampling model ended the response itself; false: cut at its max_new_tokens
])


PARTIAL_FILES = (".step_*.parquet.tmp", "step_*.parquet.tmp")
"""A killed writer's half-written step file: :meth:`TrajectoryStore.tmp_path_for`'s hidden name,
and the name an older GraftPool wrote it under."""

class TrajectoryStore:
    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)

    def path_for(self, step: int) -> Path:
        return self.folder / f"step_{step:06d}.parquet"

    def tmp_path_for(self, step: int) -> Path:
        """Where step ``step``'s file is written before its rename: a hidden name, which a Parquet
        dataset over the folder skips (names starting with "." or "_"), so a writer killed
        mid-write leaves nothing that the store's readers (``read``, a ``stored`` routing's
        ``StoredPeers``, the dashboards and reports) would open as a step."""
        return self.folder / f".step_{step:06d}.parquet.tmp"

    def write_step(self, step: int, rows: list[dict]) -> Path:
        """Write (or rewrite, on a resumed step) the rows of one step; atomic by rename."""
        return self.write_table(step, pa.Table.from_pylist(rows, schema=SCHEMA))

    def write_table(self, step: int, table: pa.Table) -> Path:
        """Write (or rewrite, on a resumed step) one step's table (:data:`SCHEMA`); atomic by rename."""
        final = self.path_for(step)
        tmp = self.tmp_path_for(step)
        pq.write_table(table, tmp)
        os.replace(tmp, final)
        return final

    def steps(self) -> list[int]:
        return sorted(int(p.stem.split("_")[1]) for p in self.folder.glob("step_*.parquet"))

    def drop_after(self, step: int) -> None:
        """Forget steps past ``step`` (used when resuming from a checkpoint at ``step``), and
        any half-written file of a killed writer."""
        for s in self.steps():
            if s > step:
                self.path_for(s).unlink()
        for tmp in (p for pattern in PARTIAL_FILES for p in self.folder.glob(pattern)):
            tmp.unlink(missing_ok=True)

    def read(self) -> pa.Table:
        if not self.steps():
            return pa.Table.from_pylist([], schema=SCHEMA)
        return ds.dataset(str(self.folder), format="parquet", schema=SCHEMA).to_table()
