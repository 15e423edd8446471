"""Per-response histograms of the gate's score s, by receiver, task and the donor response's
correctness, read from a run's trajectory store and kept in its ``run_digest.json``
(``benchmarks/learning_report.py``), so that figures of the gate's discrimination recompute from
a results copy that keeps no store (issue #53).

Each ``graft`` row of the store is one donor response offered to a receiver: ``model`` is the
receiver, ``source_model`` the donor, ``reward`` the donor response's reward (correct: above
``SUCCESS_THRESHOLD``), ``compat`` its s (Eq. 7), ``mean_logp`` the donor's l_A (Eq. 6, the mean
over the donor's n_A tokens, its end token included when it ended) and ``n_tokens`` n_B, the length of the
receiver's re-tokenisation (``workers.receiver.retokenize.retokenize``, the receiver's end included when
the donor ended), over which the receiver's mean l_B was taken. Two variants:

- ``log_s`` = ln s = l_B - l_A (the paper's per-token gate score);
- ``log_s_per_byte`` = (n_B * l_B - n_A * l_A) / bytes(response), with l_B = ln s + l_A: the
  log-likelihood ratio of the whole response per UTF-8 byte of its text, which does not depend on
  either tokenizer's granularity. n_A is not a column of the graft row: it is the ``n_tokens`` of
  the donor's own row of the same step, prompt and sample (``kind == "own"``, ``model`` = the
  donor, its ``len(token_ids)``); a donor with no own row in the store (a stored donor) or an
  empty response has no per-byte value (counted as ``missing``).

Each histogram is counted on the fixed :data:`EDGES` (ln s in [-8, 2] by 0.25; per byte the same
edges), with ``under`` (below -8, s = 0 included), ``over`` (above 2) and ``missing`` (no
value: NaN s, or no per-byte value), so that the counts of one (receiver, task,
correctness) sum to its graft rows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graftpool.contracts import SUCCESS_THRESHOLD

EDGES = [round(-8.0 + 0.25 * i, 2) for i in range(41)]
"""Bin edges of both variants: -8, -7.75, ..., 2 (40 bins; the last bin holds 2 itself)."""
VARIANTS = ("log_s", "log_s_per_byte")


def histogram(values: list[float]) -> dict[str, object]:
    """Counts of ``values`` on :data:`EDGES`: ``counts`` (one per bin, [e_i, e_i+1), the last
    closed), ``under`` (below the first edge, -inf included), ``over`` (above the last) and
    ``missing`` (NaN)."""
    x = np.asarray(values, dtype=float)
    known = x[~np.isnan(x)]
    inside = known[(known >= EDGES[0]) & (known <= EDGES[-1])]
    return {"counts": np.histogram(inside, bins=EDGES)[0].astype(int).tolist(),
            "under": int((known < EDGES[0]).sum()), "over": int((known > EDGES[-1]).sum()),
            "missing": int(len(x) - len(known))}


def log_s(compat: float | None) -> float:
    """ln s of one row (-inf for s = 0, NaN where s is missing)."""
    if compat is None or not np.isfinite(compat) or compat < 0:
        return float("nan")
    return float(np.log(compat)) if compat > 0 else float("-inf")


def log_s_per_byte(compat: float | None, l_a: float | None, n_a: int | None, n_b: int, text: str) -> float:
    """(n_B * l_B - n_A * l_A) / bytes(text), l_B = ln s + l_A (NaN where a term is missing)."""
    ln_s, size = log_s(compat), len(text.encode("utf-8"))
    if n_a is None or l_a is None or not np.isfinite(l_a) or np.isnan(ln_s) or size == 0:
        return float("nan")
    if np.isneginf(ln_s):  # s = 0: the receiver gave the response no probability
        return float("-inf")
    return (n_b * (ln_s + l_a) - n_a * l_a) / size


def donor_lengths(rows: list[dict]) -> dict[tuple, int]:
    """n_A of every own row, by (step, model, prompt id, sample): a graft row's donor response is
    the own row of its ``source_model`` with the same step, prompt and sample."""
    return {(r["step"], r["model"], r["prompt_id"], r["sample"]): r["n_tokens"] for r in rows if r["kind"] == "own"}


def graft_per_byte(row: dict, lengths: dict[tuple, int]) -> float:
    """:func:`log_s_per_byte` of one graft row (``lengths``: :func:`donor_lengths` of its store)."""
    n_a = lengths.get((row["step"], row["source_model"], row["prompt_id"], row["sample"]))
    return log_s_per_byte(row["compat"], row["mean_logp"], n_a, row["n_tokens"], row["response"] or "")


def gate_histograms(rows: list[dict]) -> dict:
    """The histograms of store rows (dicts with ``step``, ``model``, ``prompt_id``, ``task``,
    ``sample``, ``response``, ``n_tokens``, ``reward``, ``source_model``, ``kind``, ``compat``,
    ``mean_logp``): ``{"edges": EDGES, "models": {receiver: {task: {variant: {"correct": h,
    "wrong": h}}}}}`` for every receiver and task with graft rows."""
    donor_tokens = donor_lengths(rows)
    values: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in rows:
        if r["kind"] != "graft":
            continue
        which = "correct" if r["reward"] > SUCCESS_THRESHOLD else "wrong"
        got = values.setdefault((r["model"], r["task"], which), {v: [] for v in VARIANTS})
        got["log_s"].append(log_s(r["compat"]))
        got["log_s_per_byte"].append(graft_per_byte(r, donor_tokens))
    out: dict[str, dict] = {}
    for (model, task, which), got in sorted(values.items()):
        task_out = out.setdefault(model, {}).setdefault(task, {})
        for variant in VARIANTS:
            empty = histogram([])
            task_out.setdefault(variant, {"correct": empty, "wrong": empty})[which] = histogram(got[variant])
    return {"edges": EDGES, "models": out}


def store_histograms(run: Path) -> dict | None:
    """:func:`gate_histograms` of the run's trajectory store (None: the run folder has no store)."""
    if not (run / "trajectories").is_dir():
        return None
    import pyarrow.dataset as ds

    columns = ["step", "model", "prompt_id", "task", "sample", "response", "n_tokens", "reward",
               "source_model", "kind", "compat", "mean_logp"]
    return gate_histograms(ds.dataset(str(run / "trajectories"), format="parquet").to_table(
        columns=columns).to_pylist())
