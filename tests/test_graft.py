"""Pair GRAFT: candidates (Eq. 4), balanced exchange with ties, the gate (Eqs. 7-8)."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from graftpool.contracts import ExchangeInput
from policies import make_policy
from policies.graft import balanced_selection, candidates
from workers.receiver.gate_kinds import compatibility_scores
from workers.receiver.peer_transfer import gate_weights


def compatibility_weights(receiver, source, delta=0.8):
    """Eqs. 7-8 together: the gate weight of each transferred response."""
    return gate_weights(compatibility_scores(receiver, source), delta)


def test_candidates_need_receiver_all_fail_and_mixed_source():
    k_source = np.array([0, 1, 7, 8, 3, 3])
    k_receiver = np.array([0, 0, 0, 0, 1, 0])
    assert candidates(k_source, k_receiver, 8).tolist() == [False, True, True, False, False, True]


def test_candidates_n2():
    assert candidates([1, 2, 1, 0], [0, 0, 1, 0], 2).tolist() == [True, False, False, False]


def test_balanced_selection_keeps_top_m_by_source_k():
    # A -> B candidates: prompts 0,1,2 (k_A = 5, 2, 7); B -> A candidates: prompt 3 only.
    k_a = np.array([5, 2, 7, 0, 8])
    k_b = np.array([0, 0, 0, 4, 0])
    a_to_b, b_to_a = balanced_selection(k_a, k_b, 8)
    assert a_to_b.tolist() == [False, False, True, False, False]  # m = 1, highest k_A = 7
    assert b_to_a.tolist() == [False, False, False, True, False]


def test_balanced_selection_keeps_ties_at_the_boundary():
    # m = 1; A -> B candidates 0,1,2 have k_A = 3, 3, 1: both 3s tie with the 1st.
    k_a = np.array([3, 3, 1, 0])
    k_b = np.array([0, 0, 0, 2])
    a_to_b, b_to_a = balanced_selection(k_a, k_b, 4)
    assert a_to_b.tolist() == [True, True, False, False]
    assert b_to_a.tolist() == [False, False, False, True]


def test_balanced_selection_m0_moves_nothing():
    k_a = np.array([3, 2, 1])
    k_b = np.array([0, 0, 0])  # B never succeeds: no B -> A candidates, so m = 0
    a_to_b, b_to_a = balanced_selection(k_a, k_b, 4)
    assert not a_to_b.any() and not b_to_a.any()
    unbalanced, _ = balanced_selection(k_a, k_b, 4, balance=False)
    assert unbalanced.tolist() == [True, True, True]


def test_gate_hand_computed():
    receiver = np.log([0.5, 0.9, 0.81, 1.0])
    source = np.log([0.5, 1.0, 1.0, 0.5])
    s = compatibility_scores(receiver, source)
    np.testing.assert_allclose(s, [1.0, 0.9, 0.81, 2.0])
    # delta = 0.8: all admitted; w = min(s, 1)
    np.testing.assert_allclose(compatibility_weights(receiver, source), [1.0, 0.9, 0.81, 1.0])
    # delta = 0.85: 0.81 is dropped
    np.testing.assert_allclose(compatibility_weights(receiver, source, 0.85), [1.0, 0.9, 0.0, 1.0])


def test_gate_drops_at_exactly_delta():
    assert gate_weights([0.8, 0.8000001], 0.8).tolist()[0] == 0.0
    assert gate_weights([0.8, 0.8000001], 0.8).tolist()[1] > 0.8


@given(st.lists(st.floats(-50, 5), min_size=1, max_size=20), st.floats(-50, 5), st.floats(0.01, 0.99))
def test_gate_weight_in_unit_interval_and_zero_iff_below_delta(receiver, source, delta):
    receiver = np.array(receiver)
    s = compatibility_scores(receiver, np.full_like(receiver, source))
    w = compatibility_weights(receiver, np.full_like(receiver, source), delta)
    assert np.all((w >= 0) & (w <= 1))
    assert np.array_equal(w == 0, s <= delta)
    np.testing.assert_allclose(w[s > delta], np.minimum(s[s > delta], 1.0))


def test_graft_policy_routes_both_directions():
    rewards = np.zeros((2, 3, 4))
    rewards[0, 0, :2] = 1  # A mixed on prompt 0, B all-fail -> A to B
    rewards[1, 1, :1] = 1  # B mixed on prompt 1, A all-fail -> B to A
    rewards[0, 2, :] = 1  # A all pass on prompt 2: no candidate
    inp = ExchangeInput(models=["a", "b"], prompt_ids=["p0", "p1", "p2"], rewards=rewards)
    routes = make_policy("graft").plan(inp)
    assert [r.as_tuple() for r in routes] == [(1, 0, 1), (0, 1, 0)]
