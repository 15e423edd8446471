"""Where peer groups go among the minibatches (docs/algorithm.md section 2, "Peer-last updates"; ``exchange.peer_placement``)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.receiver.minibatch import minibatch_rows, order_minibatches


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


def _groups(sizes: list[int], peer: list[bool]) -> list[list[str]]:
    """Group g's trained rows as labels ``"o3.0"`` / ``"p5.2"`` (own or peer, group, row)."""
    return [[f"{'p' if is_peer else 'o'}{g}.{i}" for i in range(size)] for g, (size, is_peer)
            in enumerate(zip(sizes, peer, strict=True))]


def test_rows_split_cuts_the_ordered_rows_into_equal_runs():
    """23 own groups of 8 rows and 9 grafts, 6 of them gated out entirely (no trained row): the
    rows split gives 4 minibatches of 25-26 rows, own rows first, the 24 peer rows at the end of
    the last one; the groups split keeps the 9 graft slots and ends with a peer-only update."""
    flags = [False] * 23 + [True] * 9
    sizes = [8] * 23 + [0, 8, 0, 0, 8, 0, 8, 0, 0]
    groups = _groups(sizes, flags)
    rows = minibatch_rows(groups, flags, 4)
    assert [len(mb) for mb in rows] == [52, 52, 52, 52]
    flat = [r for mb in rows for r in mb]
    assert flat == [r for g in groups[:23] for r in g] + [r for g in groups[23:] for r in g]
    assert all(r.startswith("o") for r in rows[2]) and [r[0] for r in rows[3]] == ["o"] * 28 + ["p"] * 24
    by_groups = minibatch_rows(groups, flags, 4, split="groups")
    assert [len(mb) for mb in by_groups] == [64, 64, 56, 24] and all(r.startswith("p") for r in by_groups[3])
    assert len(minibatch_rows(groups[:23] + [[]] * 9, flags, 4, split="groups")) == 3  # the gate closed: a lost update
    assert len(minibatch_rows(groups[:23] + [[]] * 9, flags, 4)) == 4


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 9)), min_size=1, max_size=40), st.integers(1, 8),
       st.integers(0, 5), st.sampled_from(["last", "first", "spread"]))
def test_rows_split_keeps_every_row_once_in_near_equal_minibatches(spec, k, seed, placement):
    flags = [p for p, _ in spec]
    groups = _groups([size for _, size in spec], flags)
    rows = minibatch_rows(groups, flags, k, placement, np.random.default_rng(seed))
    total = sum(len(g) for g in groups)
    assert sorted(r for mb in rows for r in mb) == sorted(r for g in groups for r in g)
    assert len(rows) == min(k, total)
    if rows:
        assert max(map(len, rows)) - min(map(len, rows)) <= 1
    if placement == "last":  # peer-last holds for rows too: no own row after a peer row
        flat = [r for mb in rows for r in mb]
        assert "".join("p" if r[0] == "p" else "o" for r in flat).find("po") == -1


def test_unknown_split_names_the_field():
    with pytest.raises(ValueError, match="algorithm.minibatch_split"):
        minibatch_rows([["o0.0"]], [False], 1, split="tokens")


def test_spread_under_the_rows_split_can_end_with_a_peer_only_update():
    """``spread``'s "no peer-only minibatch" holds for its minibatches of groups (``split:
    groups``); the default ``rows`` split re-cuts the ordered rows into equal runs, so where the
    peer groups dealt to the last minibatch hold more rows than a run, that run is peer rows only
    (docs/algorithm.md and config.md say so; issue #51's forty-fourth read, half b)."""
    sizes, is_peer = [8, 8, 8, 1, 8, 1, 8, 1], [False, False] + [True] * 6
    rows = [[(g, r) for r in range(n)] for g, n in enumerate(sizes)]
    by_groups = minibatch_rows(rows, is_peer, 2, "spread", split="groups")
    assert all(any(not is_peer[g] for g, _ in mb) for mb in by_groups)
    by_rows = minibatch_rows(rows, is_peer, 2, "spread", split="rows")
    assert [len(mb) for mb in by_rows] == [22, 21]
    assert all(is_peer[g] for g, _ in by_rows[-1])
