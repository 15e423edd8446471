"""The exchange-policy registry and the none / pool / sgt / stored policies."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graftpool.contracts import SGT, ExchangeInput
from policies import available_policies, make_policy
from policies.stored import StoredPeers


def _input(rewards, live=None):
    m, p, _ = np.shape(rewards)
    return ExchangeInput(models=[f"m{i}" for i in range(m)], prompt_ids=[f"q{j}" for j in range(p)],
                         rewards=rewards, live=live)


def test_registry_lists_the_builtin_policies():
    assert set(available_policies()) >= {"none", "graft", "pool", "stored", "sgt"}


def test_unknown_policy_and_parameter_name_what_is_expected():
    with pytest.raises(ValueError, match=r"exchange.name.*'graft'"):
        make_policy("grafted")
    with pytest.raises(ValueError, match=r"exchange.params.*\['balance', 'donor', 'seed'\]"):
        make_policy("pool", donors="x")
    with pytest.raises(ValueError, match=r"exchange\.params\.donor"):
        make_policy("pool", donor="x")


def test_params_are_read_as_their_declared_types_and_bounds():
    """``exchange.params`` are typed as every config field is: a YAML 1.2 ``no`` or ``off`` (a
    string) switches a boolean off instead of being a true string, ``3e-4`` (a string in YAML) is
    a number, and a value out of its type or bounds fails naming ``exchange.params.<name>``."""
    assert make_policy("graft", balance="no").routing.balance is False
    hacpo = make_policy("hacpo", peer_coefficient="off", eps_low="3e-4", window="5", ratio_clamp=["0.2", 5]).transfer
    assert (hacpo.peer_coefficient, hacpo.eps_low, hacpo.window, hacpo.ratio_clamp) == (False, 3e-4, 5, (0.2, 5.0))
    assert make_policy("sgt", coef="0.5").trainer_params() == {"sgt_coef": 0.5}
    for name, params, field in [("sgt", {"coef": "abc"}, "coef"), ("sgt", {"coef": -1}, "coef"),
                                ("sgt", {"seed": -1}, "seed"), ("pool", {"seed": "x"}, "seed"),
                                ("hacpo", {"window": 2.5}, "window"), ("hacpo", {"window": 0}, "window"),
                                ("hacpo", {"ratio_clamp": [1]}, "ratio_clamp"), ("hacpo", {"ratio_clamp": 5}, "ratio_clamp"),
                                ("hacpo", {"ratio_clamp": [10, 0.1]}, "ratio_clamp"), ("hacpo", {"lb": -5}, "lb"),
                                ("hacpo", {"eps_high": -1}, "eps_high"), ("stored", {"store": "s", "peers": "a"}, "peers")]:
        with pytest.raises(ValueError, match=rf"exchange\.params\.{field}: expected"):
            make_policy(name, **params)
    with pytest.raises(ValueError, match=r"exchange.name: 'hacpo' shares rollouts among at least 2 models, got 1"):
        make_policy("hacpo").check_pool(1)


def test_none_routes_nothing():
    rewards = np.zeros((2, 1, 4))
    rewards[0, 0, 0] = 1
    assert make_policy("none").plan(_input(rewards)) == []


def test_graft_refuses_three_models():
    with pytest.raises(ValueError, match="exactly 2"):
        make_policy("graft").plan(_input(np.zeros((3, 1, 4))))


def test_pool_policy_matches_route_and_keeps_state():
    rewards = np.zeros((3, 2, 4))
    rewards[1, 0, :2] = 1
    rewards[0, 1, :3] = 1
    policy = make_policy("pool", donor="most_successes", balance="none")
    routes = [r.as_tuple() for r in policy.plan(_input(rewards))]
    assert routes == [(1, 0, 0), (0, 1, 1), (1, 2, 0), (0, 2, 1)]
    assert policy.state_dict() == {"step": 1}


def test_sgt_sends_one_correct_response_even_from_an_all_pass_peer():
    rewards = np.zeros((2, 3, 4))
    rewards[0, 0] = 1  # all pass: no GRAFT candidate, but an SGT one
    rewards[0, 1, 2] = 1
    rewards[0, 2] = [1, 0, 1, 1]  # three correct responses out of four
    routes = make_policy("sgt", seed=1).plan(_input(rewards))
    assert [(r.donor, r.receiver, r.prompt, r.kind) for r in routes] == [
        (0, 1, 0, SGT), (0, 1, 1, SGT), (0, 1, 2, SGT)]
    assert routes[1].samples == (2,)
    # a uniform, seeded draw among the correct ones: never the wrong sample 1, each correct one sometimes
    drawn = [make_policy("sgt", seed=seed).plan(_input(rewards))[2].samples for seed in range(40)]
    assert all(len(s) == 1 for s in drawn) and {s[0] for s in drawn} == {0, 2, 3}
    assert drawn == [make_policy("sgt", seed=seed).plan(_input(rewards))[2].samples for seed in range(40)]


def _write_store(path, model="peer", n=4):
    rows = []
    # prompt a: step 0 mixed (k=1), step 3 all-fail -> the mixed group of step 0 is kept
    # prompt b: step 1 all-pass only -> kept (no mixed group), not eligible as a donor
    for step, prompt, rewards in [(0, "a", [1, 0, 0, 0]), (3, "a", [0, 0, 0, 0]), (1, "b", [1, 1, 1, 1])]:
        for i, r in enumerate(rewards):
            rows.append(dict(step=step, model=model, prompt_id=prompt, sample=i, response=f"{prompt}{step}{i}",
                             n_tokens=3, reward=float(r), advantage=0.5 if r else -0.5, source_model=model,
                             weight=1.0, compat=None, policy_version=step, mean_logp=-1.0))
    # a grafted row written under the peer: must not count as the peer's own
    rows.append(dict(step=2, model=model, prompt_id="c", sample=0, response="x", n_tokens=1, reward=1.0,
                     advantage=1.0, source_model="other", weight=1.0, compat=0.9, policy_version=2, mean_logp=-1.0))
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_stored_peers_read_a_trajectory_store(tmp_path):
    store = tmp_path / "trajectories.parquet"
    _write_store(store)
    peers = StoredPeers(store, "peer")
    assert len(peers) == 2
    assert peers.responses("a") == ["a00", "a01", "a02", "a03"]
    assert peers.responses("c") is None
    record = peers.record(["a", "c"], ["prompt a", "prompt c"], ["model", "prompt_id", "sample", "prompt",
                                                                  "response", "reward", "advantage", "mean_logp"])
    assert record["model"] == ["peer@store"] * 4 and record["prompt"] == ["prompt a"] * 4  # no group for c
    assert record["response"] == ["a00", "a01", "a02", "a03"] and record["mean_logp"] == [-1.0] * 4
    rewards = peers.rewards_for(["a", "b", "c"], 4)
    assert rewards[0].tolist() == [1, 0, 0, 0] and np.isnan(rewards[2]).all()


def test_stored_policy_routes_from_stored_rows_to_live_models(tmp_path):
    store = tmp_path / "trajectories.parquet"
    _write_store(store)
    peers = StoredPeers(store, "peer")
    prompt_ids = ["a", "b", "c"]
    live_rewards = np.zeros((1, 3, 4))
    rewards = np.concatenate([live_rewards, peers.rewards_for(prompt_ids, 4)[None]], axis=0)
    inp = ExchangeInput(models=["me", "peer@store"], prompt_ids=prompt_ids, rewards=rewards,
                        live=[True, False])
    assert inp.k[1].tolist() == [1, 4, -1]
    routes = make_policy("stored", store=str(store), peers=["peer"]).plan(inp)
    assert [r.as_tuple() for r in routes] == [(1, 0, 0)]


def test_stored_policy_never_feeds_a_model_its_own_stored_groups():
    # live a, b; stored a@store, b@store; all live all-fail, both stored mixed on prompt 0
    rewards = np.zeros((4, 1, 4))
    rewards[2:, 0, :2] = 1
    inp = ExchangeInput(models=["a", "b", "a@store", "b@store"], prompt_ids=["q"], rewards=rewards,
                        live=[True, True, False, False])
    routes = make_policy("stored", store="x", peers=["a", "b"]).plan(inp)
    assert sorted(r.as_tuple() for r in routes) == [(2, 1, 0), (3, 0, 0)]


def test_stored_policy_needs_a_store_and_peers():
    with pytest.raises(ValueError, match="'peers'"):
        make_policy("stored", store="x")


def test_stored_peers_report_a_missing_store(tmp_path):
    with pytest.raises(FileNotFoundError, match="exchange.params.store"):
        StoredPeers(tmp_path / "nope", "peer")


def test_compatibility_requests_list_every_eligible_donor_group():
    from orchestrator.controller.exchange import compatibility_requests, mean_compatibility

    rewards = np.zeros((3, 2, 4))
    rewards[1, 0, :2] = 1  # model 1 mixed on prompt 0
    rewards[2, 0, :1] = 1  # model 2 mixed on prompt 0
    rewards[0, 1, :3] = 1  # model 0 mixed on prompt 1
    requests = compatibility_requests(_input(rewards))
    assert requests == {0: [(1, 0), (2, 0)], 1: [(0, 1)], 2: [(0, 1)]}
    # s = exp(receiver - donor) = [1.0, 0.5]
    assert mean_compatibility(np.log([0.5, 0.125]), np.log([0.5, 0.25])) == pytest.approx(0.75)
    assert mean_compatibility([-np.inf], [0.0]) == 0.0


def test_advantages_refuse_a_record_not_laid_out_model_by_model_prompt_by_prompt():
    """``with_advantages`` reshapes rewards to [models, prompts, n]: a record in another order
    (two samples swapped across prompts) would give each group another group's rewards, so it is
    refused (``group_shape``) rather than silently mis-grouped."""
    from graftpool.step_record import StepRecord
    from orchestrator.controller.exchange import with_advantages

    rows = [{"model": m, "prompt_id": p, "sample": i, "reward": float(i == 0)}
            for m in ("a", "b") for p in ("q0", "q1") for i in range(2)]
    ordered = with_advantages(StepRecord.from_rows(rows), ["a", "b"], 2)
    assert ordered["advantage"][:2] == [pytest.approx(0.7071, abs=1e-3), pytest.approx(-0.7071, abs=1e-3)]
    rows[1], rows[2] = rows[2], rows[1]  # a/q0/1 and a/q1/0 change places
    with pytest.raises(ValueError, match="model by model, prompt by prompt"):
        with_advantages(StepRecord.from_rows(rows), ["a", "b"], 2)
