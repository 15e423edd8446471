"""Checks of a finished run's trajectory store against docs/algorithm.md (Eq. 4, Eqs. 7-8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.dataset as ds


def read_store(run_dir: Path) -> list[dict]:
    return ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table().to_pylist()


def check_store(rows: list[dict], n: int, delta: float, steps: int, prompts: int, models: list[str],
                transfer=None) -> int:
    """Assert the store's invariants; return the number of grafted groups. ``transfer`` (an
    ``algorithm`` config) checks the ablations of ``workers.receiver.peer_transfer`` instead of the
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
            if transfer is not None and not transfer.gate:  # the no-gate ablation: w = 1, all admitted
                assert r["trained"] and r["weight"] == 1.0
            elif r["compat"] > delta:
                assert r["trained"] and np.isclose(r["weight"], min(r["compat"], 1.0))
            else:
                assert not r["trained"] and r["weight"] == 0.0
    return len(grafted)


def check_transfer(group: list[dict], delta: float, transfer) -> None:
    """One grafted group's rows against ``exchange.peer_responses / gate_scope /
    peer_advantages`` (workers/receiver/peer_transfer.py)."""
    offered = [r for r in group if transfer.peer_responses == "all" or r["reward"] == 1.0]
    if transfer.peer_responses == "success":  # success-only: only reward-1 rows are trained
        assert all(not r["trained"] and r["weight"] == 0.0 for r in group if r["reward"] != 1.0)
    if not transfer.gate:  # the no-gate ablation: every offered row, w = 1
        assert all(r["trained"] and r["weight"] == 1.0 for r in offered)
    elif transfer.gate_scope == "group":  # all offered rows admitted, or none, on their mean s
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


def own_successes(rows: list[dict]) -> dict[tuple, int]:
    """k of every own group: (step, model, prompt_id) -> number of correct own responses."""
    k: dict[tuple, int] = {}
    for r in rows:
        if r["kind"] == "own":
            key = (r["step"], r["model"], r["prompt_id"])
            k[key] = k.get(key, 0) + int(r["reward"] == 1.0)
    return k


def check_balance(rows: list[dict], a: str, b: str, n: int) -> list[tuple[int, int, int]]:
    """Balanced exchange (docs/algorithm.md section 2, "Balanced exchange"), recomputed from the store's own rows:
    per step and direction S -> R, C = {q : k_R(q) = 0, 1 <= k_S(q) < n}, m = min(|C_AB|,
    |C_BA|); the grafted prompts are exactly the candidates whose k_S is at least the m-th
    highest (the top m plus ties), and none when m = 0. Returns (step, m, grafts A->B + B->A)."""
    k = own_successes(rows)
    grafted: dict[tuple, set[str]] = {}
    for r in rows:
        if r["kind"] == "graft":
            grafted.setdefault((r["step"], r["source_model"], r["model"]), set()).add(r["prompt_id"])
    out = []
    for step in sorted({s for s, _, _ in k}):
        prompts = {p for s, m, p in k if s == step and m == a}
        cand = {(src, dst): {p for p in prompts if k[(step, dst, p)] == 0 and 1 <= k[(step, src, p)] < n}
                for src, dst in ((a, b), (b, a))}
        m = min(len(c) for c in cand.values())
        total = 0
        for (src, dst), c in cand.items():
            got = grafted.get((step, src, dst), set())
            if m == 0:
                assert not got, f"step {step}: m = 0, yet {src}->{dst} moved {sorted(got)}"
                continue
            cutoff = sorted((k[(step, src, p)] for p in c), reverse=True)[m - 1]
            expected = {p for p in c if k[(step, src, p)] >= cutoff}
            assert got == expected, f"step {step} {src}->{dst}: m={m}, grafted {sorted(got)} != {sorted(expected)}"
            assert len(got) >= m
            total += len(got)
        out.append((step, m, total))
    return out


def check_update_order(rows: list[dict], peer_last: bool, minibatches: int) -> int:
    """Peer-last (docs/algorithm.md section 2, "Peer-last updates") from the updates the trainer reported per row:
    per step and receiver, every update that trained only own rows comes before every update
    that trained a grafted row (after it, with ``peer_last`` False). Returns how many
    (step, receiver) had both kinds."""
    updates: dict[tuple, dict[int, set[str]]] = {}
    for r in rows:
        if r["kind"] in ("own", "graft") and r["trained"]:
            assert r["update"] >= 0, f"a trained row without its update: {r['kind']} {r['prompt_id']}"
            kinds = updates.setdefault((r["step"], r["model"]), {}).setdefault(r["update"], set())
            kinds.add(r["kind"])
        elif r["kind"] in ("own", "graft"):
            assert r["update"] == -1, f"an untrained row in update {r['update']}: {r['kind']} {r['prompt_id']}"
    both = 0
    for key, by_update in updates.items():
        assert sorted(by_update) == list(range(len(by_update))), f"{key}: updates {sorted(by_update)}"
        assert len(by_update) <= minibatches
        own_only = [u for u, kinds in by_update.items() if kinds == {"own"}]
        with_peer = [u for u, kinds in by_update.items() if "graft" in kinds]
        if own_only and with_peer:
            both += 1
            if peer_last:
                assert max(own_only) < min(with_peer), f"{key}: peer update before an own one: {by_update}"
            else:
                assert max(with_peer) < min(own_only), f"{key}: own update before a peer one: {by_update}"
    return both
