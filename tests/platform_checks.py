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


def check_hacpo_store(rows: list[dict], n: int, steps: int, prompts: int, models: list[str],
                      lb: float = 0.8, delta_step: float = 0.025, alpha: float = 1.0, updates: int = 4) -> None:
    """A HACPO run's store: under every learner, every prompt of every step carries each peer's
    whole group (kind ``peer``) next to its own, all own rows are trained, and every advantage
    equals HACPO Eq. 6-10 recomputed here from the store's rewards (capability: the mean own
    reward over the last 5 steps). A trained peer's s lies in [lb_m, 1] for some peer update m
    and its weight is s^(1 + alpha)."""
    own: dict[tuple, list[dict]] = {}
    peer: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["step"], row["model"], row["prompt_id"])
        (own if row["kind"] == "own" else peer).setdefault(key, []).append(row)
    assert {r["kind"] for r in rows} == {"own", "peer"}
    assert len(own) == steps * prompts * len(models)
    assert all(r["trained"] for group in own.values() for r in group), "HACPO replaces nothing"
    step_reward = {(s, m): np.mean([r["reward"] for (s2, m2, _), g in own.items() if (s2, m2) == (s, m) for r in g])
                   for s in range(1, steps + 1) for m in models}
    lowest = lb  # the first update may already be a peer one
    highest = min(1.0, lb + (updates - 1) * delta_step)
    for (step, learner, prompt_id), group in own.items():
        peers = peer.get((step, learner, prompt_id), [])
        sources = sorted({r["source_model"] for r in peers})
        assert sources == sorted(m for m in models if m != learner), "every peer's group, every prompt"
        for src in sources:
            src_rows = sorted((r for r in peers if r["source_model"] == src), key=lambda r: r["sample"])
            assert [r["sample"] for r in src_rows] == list(range(n))
            assert [r["response"] for r in src_rows] == [
                r["response"] for r in sorted(own[(step, src, prompt_id)], key=lambda r: r["sample"])]
        cap = np.array([np.mean([step_reward[(s, m)] for s in range(max(1, step - 4), step + 1)]) for m in models])
        cap = np.maximum(cap, 1e-8)
        rewards = np.array([[r["reward"] for r in sorted(own[(step, m, prompt_id)], key=lambda r: r["sample"])]
                            for m in models])
        k = models.index(learner)
        w = np.clip(cap[k] / cap, 0.1, 10.0)
        w[k] = 1.0
        mu = (w * rewards.sum(axis=1)).sum() / rewards.size
        if np.all(rewards == rewards.flat[0]):
            expected = np.zeros_like(rewards)
        else:
            mu = mu if mu <= 1 else rewards[k].mean()
            coef = np.clip(cap / cap[k], 0.1, 10.0)
            coef[k] = 1.0
            expected = coef[:, None] * (rewards - mu) / (rewards.std(ddof=1) + 1e-6)
        got = {r["sample"]: r["advantage"] for r in group}
        np.testing.assert_allclose([got[i] for i in range(n)], expected[k], rtol=1e-5, atol=1e-6)
        for r in peers:
            j = models.index(r["source_model"])
            assert np.isclose(r["advantage"], expected[j][r["sample"]], rtol=1e-5, atol=1e-6)
            if r["trained"]:
                assert lowest - 1e-9 <= r["compat"] <= 1.0 + 1e-9
                assert np.isclose(r["weight"], r["compat"] ** (1 + alpha), rtol=1e-5)
            else:
                assert r["weight"] == 0.0 and (r["compat"] < highest or r["compat"] > 1.0)
