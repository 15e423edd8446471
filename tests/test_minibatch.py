"""Where peer groups go among the minibatches (docs/algorithm.md section 2, step 8; ``exchange.peer_placement``)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.receiver.minibatch import order_minibatches


def test_peer_groups_come_last():
    flags = [True, False, False, True, False, False, False, False]
    batches = order_minibatches(flags, 4)
    assert batches == [[1, 2], [4, 5], [6, 7], [0, 3]]


def test_peer_first_ablation_reverses_the_classes():
    flags = [True, False, False, True]
    assert order_minibatches(flags, 2, placement="first") == [[0, 3], [1, 2]]


def test_more_minibatches_than_groups_leaves_no_empty_batch():
    assert order_minibatches([False, True], 4) == [[0], [1]]
    assert order_minibatches([], 4) == []


def test_rejects_zero_minibatches():
    with pytest.raises(ValueError, match="minibatches"):
        order_minibatches([False], 0)


@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(1, 8), st.integers(0, 5))
def test_every_own_only_minibatch_precedes_every_peer_minibatch(flags, k, seed):
    batches = order_minibatches(flags, k, rng=np.random.default_rng(seed))
    assert sorted(i for b in batches for i in b) == list(range(len(flags)))
    has_peer = [any(flags[i] for i in b) for b in batches]
    first_peer = has_peer.index(True) if True in has_peer else len(batches)
    assert not any(has_peer[:first_peer]) and all(has_peer[first_peer:])
    assert max(map(len, batches)) - min(map(len, batches)) <= 1


def test_spread_leaves_no_peer_only_minibatch_and_keeps_the_update_count():
    # 23 own groups and 9 grafts, 4 minibatches: the learning benchmark's typical step
    flags = [False] * 23 + [True] * 9
    last = order_minibatches(flags, 4)
    assert [all(flags[i] for i in b) for b in last] == [False, False, False, True]  # a peer-only update
    spread = order_minibatches(flags, 4, placement="spread")
    assert len(spread) == 4 and all(not flags[b[0]] for b in spread)  # every minibatch opens with own groups
    assert [sum(flags[i] for i in b) for b in spread] == [2, 2, 2, 3]  # dealt from the last one backwards
    assert sorted(i for b in spread for i in b) == list(range(32))


def test_spread_with_few_grafts_puts_them_in_the_last_minibatches():
    flags = [False] * 8 + [True] * 2
    assert order_minibatches(flags, 4, placement="spread") == [[0, 1], [2, 3], [4, 5, 9], [6, 7, 8]]
    assert order_minibatches([True, True], 4, placement="spread") == [[0], [1]]  # no own group at all


def test_unknown_placement_names_the_field():
    with pytest.raises(ValueError, match="exchange.peer_placement"):
        order_minibatches([False], 1, placement="middle")
