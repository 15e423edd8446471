"""Checks of a finished run's trajectory store against GRAFT_SPEC (Eq. 4, Eqs. 7-8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as ds


def read_store(run_dir: Path) -> list[dict]:
    return ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table().to_pylist()


def check_store(rows: list[dict], n: int, delta: float, steps: int, prompts: int, models: list[str],
                transfer=None) -> int:
    """Assert the store's invariants; return the number of grafted groups. ``transfer`` (an
    ``algorithm`` config) checks the ablations of ``workers.peer_transfer`` instead of the
    paper's per-response gate and donor advantages."""
    own: dict[tuple, list[dict]] = {}
    grafted: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["step"], row["model"], row["prompt_id"])
        (own if row["kind"] == "own" else grafted if row["kind"] == "graft" else {}).setdefault(key, []).append(row)
    # every model wrote every own response of every step exactly once
    assert len(own) == steps * prompts * len(models)
    assert all(sorted(r["sample"] for r in group) == list(range(n)) for group in own.values())
    for (step, receiver, prompt_id), group in grafted.items():
        donors = {r["source_model"] for r in group}
        assert len(donors) == 1, "a receiver gets at most one donor group per prompt"
        donor = donors.pop()
        assert donor != receiver
        assert sorted(r["sample"] for r in group) == list(range(n)), "the WHOLE donor group moves"
        receiver_k = sum(r["reward"] for r in own[(step, receiver, prompt_id)])
        assert receiver_k == 0, "Eq. 4: the receiver failed every rollout"
        assert not any(r["trained"] for r in own[(step, receiver, prompt_id)]), "replaced, not trained"
        donor_own = own.get((step, donor, prompt_id))
        donor_k = sum(r["reward"] for r in (donor_own or group))
        assert 1 <= donor_k < n, "Eq. 4: the donor group has a success and a failure"
        if transfer is not None and (transfer.peer_responses, transfer.gate_scope, transfer.peer_advantages) != (
                "all", "response", "donor"):
            check_transfer(group, delta, transfer)
            continue
        for r in group:
            if donor_own is not None:  # a live donor: the advantage is the donor's own (not re-normalised)
                match = next(o for o in donor_own if o["sample"] == r["sample"])
                assert r["advantage"] == match["advantage"] and r["response"] == match["response"]
            if r["compat"] > delta:
                assert r["trained"] and np.isclose(r["weight"], min(r["compat"], 1.0))
            else:
                assert not r["trained"] and r["weight"] == 0.0
    return len(grafted)


def check_transfer(group: list[dict], delta: float, transfer) -> None:
    """One grafted group's rows against ``algorithm.peer_responses / gate_scope /
    peer_advantages`` (workers/peer_transfer.py)."""
    offered = [r for r in group if transfer.peer_responses == "all" or r["reward"] == 1.0]
    if transfer.peer_responses == "success":  # success-only: only reward-1 rows are trained
        assert all(not r["trained"] and r["weight"] == 0.0 for r in group if r["reward"] != 1.0)
    if transfer.gate_scope == "group":  # all offered rows admitted, or none, on their mean s
        assert len({r["trained"] for r in offered}) == 1, "the group gate admits all or none"
        mean = float(np.mean([r["compat"] for r in offered if np.isfinite(r["compat"])]))
        expected = min(mean, 1.0) if mean > delta else 0.0
        assert all(np.isclose(r["weight"], expected) for r in offered)
    else:
        for r in offered:
            assert r["trained"] == (r["compat"] > delta)
    admitted = [r["advantage"] for r in group if r["trained"]]
    if transfer.peer_advantages == "recentered" and admitted:  # zero-sum again
        assert abs(sum(admitted)) < 1e-4, admitted
