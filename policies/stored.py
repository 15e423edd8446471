"""``stored`` routing: donors are groups read from an earlier run's trajectory store (Figure 3b).

No co-training: the live models receive, rows of the exchange input marked not live
(filled by the controller from :class:`StoredPeers`) donate. Prompt-matched, with
balancing off, and the donor choice of GRAFT (most successes). The ``stored`` preset takes
them with the ``graft`` transfer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from graftpool.contracts import SUCCESS_THRESHOLD, ExchangeInput
from graftpool.step_record import StepRecord
from policies.interface import ParamError
from policies.pool import route
from policies.routing import Routing, Triple, register_routing

STORE_COLUMNS = ["step", "model", "prompt_id", "sample", "response", "reward", "advantage",
                 "source_model", "policy_version"]


class StoredPeers:
    """Read one peer's own groups from a Parquet trajectory store (a file or a folder).

    For each prompt the group of the latest step in which the peer's group was mixed
    (1 <= k < n) is kept, else its latest group **[choice]**. Only the peer's own
    responses count (``source_model == model``), never what it received by exchange.
    """

    def __init__(self, path: str | Path, model: str):
        import pyarrow as pa  # here, not at the top: only a stored routing reads a store
        import pyarrow.dataset as ds

        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"exchange.params.store: no trajectory store at {path}")
        # every step file's columns: a dataset takes its first file's schema, and a run resumed
        # with a newer GraftPool wrote its later steps with columns its first ones lack (``finished``)
        schemas = [part.physical_schema for part in ds.dataset(str(path), format="parquet").get_fragments()]
        if not schemas:  # pa.unify_schemas([]) would say only "Must provide at least one schema to unify"
            raise ValueError(f"exchange.params.store: the trajectory store {path} holds no step file "
                             "(step_NNNNNN.parquet): its run wrote no step yet")
        dataset = ds.dataset(str(path), format="parquet", schema=pa.unify_schemas(schemas))
        missing = sorted(set(STORE_COLUMNS) - set(dataset.schema.names))
        if missing:
            raise ValueError(f"trajectory store {path} lacks columns {missing}")
        # optional: ``mean_logp``; ``finished`` (a store written before it was a column: every
        # response is taken as finished, as it was before)
        columns = STORE_COLUMNS + [c for c in ("mean_logp", "finished") if c in dataset.schema.names]
        table = dataset.to_table(
            columns=columns,
            filter=(ds.field("model") == model) & (ds.field("source_model") == model),
        )
        if table.num_rows == 0:
            raise ValueError(f"trajectory store {path} holds no own responses of model {model!r}")
        self.path = path
        self.model = model
        by_key: dict[tuple[str, int], list[dict]] = {}
        for row in table.to_pylist():
            by_key.setdefault((row["prompt_id"], row["step"]), []).append(row)
        self._groups: dict[str, list[dict]] = {}  # prompt id -> the kept group's rows, by sample
        best: dict[str, tuple[bool, int]] = {}
        for (prompt_id, step), rows in by_key.items():
            rows.sort(key=lambda r: r["sample"])
            successes = sum(r["reward"] > SUCCESS_THRESHOLD for r in rows)
            rank = (bool(0 < successes < len(rows)), int(step))
            if prompt_id in best and best[prompt_id] >= rank:
                continue
            best[prompt_id] = rank
            self._groups[prompt_id] = rows

    def __len__(self) -> int:
        return len(self._groups)

    def check_usable(self, prompt_ids: Iterable[str], n: int) -> None:
        """Raise ValueError, naming the store, where none of the kept groups could ever donate in a
        run of group size ``n`` over ``prompt_ids`` (its ``data.train``): :meth:`rewards_for` gives a
        group of another size no rewards (read as no group: never eligible), and a prompt the run never
        samples is never asked for, so such a store left the run training alone, silently."""
        sizes = sorted({len(rows) for rows in self._groups.values()})
        if n not in sizes:
            raise ValueError(
                f"exchange.params.store: the trajectory store {self.path} holds groups of {sizes} responses of "
                f"model {self.model!r}, but algorithm.n is {n}: a stored group is taken only with as many "
                "responses as algorithm.n, so none would ever be used; name the store of a run with the "
                "same algorithm.n, or set algorithm.n to the store's")
        wanted = set(prompt_ids)
        if not any(p in wanted for p, rows in self._groups.items() if len(rows) == n):
            raise ValueError(
                f"exchange.params.store: none of the prompts of model {self.model!r}'s groups in the trajectory "
                f"store {self.path} is in data.train ({len(self._groups)} prompts stored, {len(wanted)} in "
                "data.train), so none would ever be used; name the store of a run on the same data.train")

    def responses(self, prompt_id: str) -> list[str] | None:
        """The kept group's responses on ``prompt_id`` (None: the store has none)."""
        rows = self._groups.get(prompt_id)
        return None if rows is None else [r["response"] for r in rows]

    def rewards_for(self, prompt_ids: list[str], n: int) -> np.ndarray:
        """[P, n] rewards for these prompts, NaN rows where the store has no group of size n."""
        out = np.full((len(prompt_ids), n), np.nan)
        for i, prompt_id in enumerate(prompt_ids):
            rows = self._groups.get(prompt_id)
            if rows is not None and len(rows) == n:
                out[i] = [r["reward"] for r in rows]
        return out

    def record(self, prompt_ids: list[str], prompts: list[str], columns: list[str]) -> StepRecord:
        """The kept groups on these prompts as rows of the step's record (``columns``), under the
        donor name :func:`stored_row_name`: the stored reward, advantage and source-side
        ``mean_logp`` (None where the store has none), the prompt as given now; no token ids or
        log-probs (they are in the stored model's tokenizer, and a receiver re-tokenises), and whether
        the stored model ended each response itself (``finished``: a response cut at its
        ``max_new_tokens`` is re-tokenised without the receiver's end, as a live donor's is)."""
        out = []
        for prompt_id, prompt in zip(prompt_ids, prompts, strict=True):
            for row in self._groups.get(prompt_id, []):
                out.append({**dict.fromkeys(columns), "model": stored_row_name(self.model), "prompt_id": prompt_id,
                            "sample": row["sample"], "prompt": prompt, "rendered_prompt": prompt,
                            "response": row["response"], "token_ids": [], "gen_logprobs": [],
                            "finished": row.get("finished") is not False,
                            "policy_version": int(row["policy_version"]), "reward": float(row["reward"]),
                            "reason": "", "advantage": float(row["advantage"]),
                            "mean_logp": (None if "mean_logp" not in row else float("nan") if row["mean_logp"] is None
                                          else float(row["mean_logp"]))})
        return StepRecord.from_rows(out, columns)


@register_routing("stored")
@dataclass
class StoredRouting(Routing):
    """Live models receive from stored peers; a model never receives its own stored groups.

    ``peers`` names the models of the earlier run whose own groups donate; their rows in
    the exchange input are named ``<peer>@store`` (see :func:`stored_row_name`).
    """

    donor_tokens = False  # a stored donor keeps its responses' text and means, not their tokens

    store: str = ""  # path of the earlier run's trajectory store
    peers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.store or not self.peers:
            raise ParamError(None, "routing 'stored' needs 'store' (a trajectory store path) "
                                   "and 'peers' (the model names whose groups donate)")

    def stored_donors(self) -> list[StoredPeers]:
        return [StoredPeers(self.store, peer) for peer in self.peers]

    def plan(self, inp: ExchangeInput, usable: np.ndarray) -> list[Triple]:
        stored = np.flatnonzero(~inp.live).tolist()
        triples: list[Triple] = []
        for m in np.flatnonzero(inp.live).tolist():
            donors = [d for d in stored if inp.models[d] != stored_row_name(inp.models[m])]
            triples += route(inp.k, inp.n, donor="most_successes", balance="none", receivers=[m], donors=donors,
                             usable=usable)
        return triples


def stored_row_name(model: str) -> str:
    return f"{model}@store"
