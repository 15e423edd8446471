"""Pool routing for N models (docs/algorithm.md section 4) and the N = 2 equivalence rule."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.graft import balanced_selection, candidates
from policies.pool import route

N = 4


def test_hand_computed_three_models_no_balance():
    # prompt:   0  1  2  3
    k = np.array([[0, 2, 0, 4],   # model 0
                  [3, 0, 0, 0],   # model 1
                  [1, 0, 0, 2]])  # model 2
    routes = route(k, N, donor="most_successes", balance="none")
    # model 0 fails prompts 0 and 2: donors for 0 are 1 (k=3) and 2 (k=1); none for 2
    # model 1 fails 1, 2, 3: prompt 1 <- 0 (k=2); prompt 3: model 0 has k=4=n (not mixed) -> 2
    # model 2 fails 1, 2: prompt 1 <- 0
    assert routes == [(1, 0, 0), (0, 1, 1), (2, 1, 3), (0, 2, 1)]


def test_pairwise_balance_hand_computed():
    k = np.array([[0, 2, 0, 4],
                  [3, 0, 0, 0],
                  [1, 0, 0, 2]])
    # pair (0,1): C01 = {1}, C10 = {0} -> m = 1, both move
    # pair (0,2): C02 = {1}, C20 = {0} -> m = 1, both move
    # pair (1,2): C12 = {}, C21 = {3} -> m = 0, nothing
    # receiver 0 prompt 0: donors 1 (k=3) and 2 (k=1) allowed -> most_successes picks 1
    routes = route(k, N, donor="most_successes", balance="pairwise")
    assert routes == [(1, 0, 0), (0, 1, 1), (0, 2, 1)]


def test_least_used_and_most_successes_choose_different_donors_after_balancing():
    # prompt:   0  1  2  3
    k = np.array([[0, 0, 2, 2],   # model 0
                  [3, 3, 0, 0],   # model 1
                  [0, 1, 0, 0]])  # model 2
    # pair (0,1): C10 = {0, 1}, C01 = {2, 3} -> m = 2, all move
    # pair (0,2): C20 = {1}, C02 = {2, 3} (tied k=2) -> m = 1: 2->0 q1; 0->2 q2 and q3 (ties)
    # pair (1,2): C12 = {0}, C21 = {} -> m = 0, nothing
    # receiver 0: q0 <- 1 only (load of 1 becomes 1); q1: donors 1 (k=3, load 1) and 2 (k=1, load 0)
    common = [(0, 1, 2), (0, 1, 3), (0, 2, 2), (0, 2, 3)]
    assert route(k, N, donor="most_successes", balance="pairwise") == [(1, 0, 0), (1, 0, 1), *common]
    assert route(k, N, donor="least_used", balance="pairwise") == [(1, 0, 0), (2, 0, 1), *common]


def test_pool_balance_uses_one_common_target():
    k = np.array([[0, 0, 3, 1],
                  [2, 1, 0, 0],
                  [1, 3, 2, 3]])
    # candidate counts: receiver 0 -> {0, 1}, receiver 1 -> {2, 3}, receiver 2 -> {} => m = 0
    assert route(k, N, balance="pool") == []
    k2 = k.copy()
    k2[2] = [0, 0, 0, 0]
    # receiver 0: {0 (best k 2), 1 (1)} ; receiver 1: {2 (3), 3 (1)} ; receiver 2: {0..3}
    # target = min(2, 2, 4) = 2 -> every receiver keeps 2 (plus ties)
    routes = route(k2, N, balance="pool")
    by_receiver = {m: [q for _, r, q in routes if r == m] for m in range(3)}
    assert by_receiver[0] == [0, 1] and by_receiver[1] == [2, 3]
    # receiver 2's candidates ranked by best donor k: q0 (2), q1 (1), q2 (3), q3 (1) -> q2, q0
    assert by_receiver[2] == [0, 2]


def test_most_compatible_picks_highest_mean_s():
    k = np.array([[0], [1], [3]])
    compat = np.full((3, 3, 1), np.nan)
    compat[1, 0, 0] = 0.95
    compat[2, 0, 0] = 0.85
    assert route(k, N, donor="most_compatible", balance="none", compatibility=compat) == [(1, 0, 0)]
    assert route(k, N, donor="most_successes", balance="none") == [(2, 0, 0)]
    with pytest.raises(ValueError, match="compatibility"):
        route(k, N, donor="most_compatible")


def test_random_donor_is_seeded():
    k = np.array([[0] * 30, [1] * 30, [2] * 30])
    a = route(k, N, donor="random", balance="none", seed=3)
    assert a == route(k, N, donor="random", balance="none", seed=3)
    assert {d for d, _, _ in a} == {1, 2}


def test_least_used_spreads_load():
    k = np.array([[0] * 6, [3] * 6, [1] * 6])
    routes = route(k, N, donor="least_used", balance="none")
    donors = [d for d, _, _ in routes]
    assert donors.count(1) == 3 and donors.count(2) == 3


def test_ties_of_least_used_and_most_compatible_go_to_more_successes_then_the_lower_index():
    """docs/algorithm.md's tie rule (issue #51's forty-sixth read: it said "the lower model index"
    for every strategy, while an equal load or s goes to the donor with more successes first)."""
    k = np.array([[0], [1], [3]])
    assert route(k, N, donor="least_used", balance="none") == [(2, 0, 0)]  # both loads 0: k 3 over k 1
    assert route(k, N, donor="most_successes", balance="none") == [(2, 0, 0)]
    compat = np.full((3, 3, 1), np.nan)
    compat[1, 0, 0] = compat[2, 0, 0] = 0.9
    assert route(k, N, donor="most_compatible", balance="none", compatibility=compat) == [(2, 0, 0)]
    same = np.array([[0], [2], [2]])
    assert route(same, N, donor="least_used", balance="none") == [(1, 0, 0)]  # then the lower index


def test_bad_names_are_reported():
    with pytest.raises(ValueError, match=r"exchange\.params\.donor"):
        route(np.zeros((2, 2), int), N, donor="best")
    with pytest.raises(ValueError, match=r"exchange\.params\.balance"):
        route(np.zeros((2, 2), int), N, balance="fair")


def test_n2_groups():
    k = np.array([[1, 0, 2], [0, 1, 0]])
    assert route(k, 2, balance="none") == [(1, 0, 1), (0, 1, 0)]


k_matrices = st.integers(2, 5).flatmap(
    lambda m: st.integers(1, 12).flatmap(
        lambda p: st.integers(2, 8).flatmap(
            lambda n: st.tuples(
                st.just(n),
                st.lists(st.lists(st.integers(0, n), min_size=p, max_size=p), min_size=m, max_size=m),
            )
        )
    )
)


@settings(max_examples=200, deadline=None)
@given(k_matrices, st.sampled_from(["most_successes", "least_used", "random"]),
       st.sampled_from(["pairwise", "pool", "none"]), st.integers(0, 100))
def test_routes_go_from_mixed_donor_to_all_fail_receiver_once(data, donor, balance, seed):
    n, k = data
    k = np.array(k)
    routes = route(k, n, donor=donor, balance=balance, seed=seed)
    for d, m, q in routes:
        assert k[m, q] == 0
        assert 1 <= k[d, q] < n
        assert d != m
    assert len({(m, q) for _, m, q in routes}) == len(routes)
    if balance == "none":
        # every all-fail (m, q) with an eligible donor is served
        served = {(m, q) for _, m, q in routes}
        for m in range(k.shape[0]):
            for q in range(k.shape[1]):
                has_donor = any(candidates(k[d, q:q + 1], k[m, q:q + 1], n)[0]
                                for d in range(k.shape[0]) if d != m)
                assert ((m, q) in served) == has_donor
    if balance == "pairwise":
        for d, m, q in routes:
            d_to_m, _ = balanced_selection(k[d], k[m], n)
            assert d_to_m[q]


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 8).flatmap(
    lambda n: st.tuples(st.just(n), st.integers(1, 40).flatmap(
        lambda p: st.lists(st.lists(st.integers(0, n), min_size=p, max_size=p), min_size=2, max_size=2)))))
def test_n2_pool_routing_equals_pair_graft(data):
    n, k = data
    k = np.array(k)
    a_to_b, b_to_a = balanced_selection(k[0], k[1], n)
    expected = sorted([(0, 1, int(q)) for q in np.flatnonzero(a_to_b)]
                      + [(1, 0, int(q)) for q in np.flatnonzero(b_to_a)])
    assert sorted(route(k, n, donor="most_successes", balance="pairwise")) == expected
    # With two models the pool-wide target is the same m, so it routes the same too.
    assert sorted(route(k, n, donor="most_successes", balance="pool")) == expected
