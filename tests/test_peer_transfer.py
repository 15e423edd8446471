"""The GRAFT ablations of workers/receiver/peer_transfer.py, against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from workers.receiver.gate_kinds import GateInputs
from workers.receiver.objective import grpo_advantages
from workers.receiver.peer_transfer import (
    PEER_ADVANTAGES,
    PeerTransfer,
    gate,
    offered_responses,
    pooled_advantages,
    recentered_advantages,
)

DONOR_REWARDS = np.array([1.0, 0.0, 0.0, 0.0])
# Eq. 1 on [1, 0, 0, 0]: mean 0.25, unbiased std 0.5 -> [1.5, -0.5, -0.5, -0.5]
DONOR_ADV = grpo_advantages(DONOR_REWARDS[None]).numpy()[0].astype(float)


def test_donor_advantages_are_kept():
    np.testing.assert_allclose(DONOR_ADV, [1.5, -0.5, -0.5, -0.5], atol=1e-5)
    out = PEER_ADVANTAGES.get("donor")(DONOR_REWARDS, DONOR_ADV, np.zeros(4), np.ones(4, bool))
    np.testing.assert_array_equal(out, DONOR_ADV)


def test_pooled_advantages_normalise_over_both_groups():
    # R = [0, 0, 0, 0 | 1, 0, 1, 0]: mean 0.25, unbiased std sqrt(1.5 / 7) = 0.462910
    out = pooled_advantages(np.array([1.0, 0, 1, 0]), None, np.zeros(4), np.ones(4, bool))
    np.testing.assert_allclose(out, [0.75 / 0.462910, -0.25 / 0.462910] * 2, rtol=1e-5)
    assert not np.isclose(out.sum(), 0.0)  # no longer zero-sum over the donor group


def test_recentered_advantages_sum_to_zero_over_the_admitted():
    # admitted {0, 1}: a = [1.5, -0.5], mean 0.5, unbiased std sqrt(2) -> [+0.7071, -0.7071]
    out = recentered_advantages(DONOR_REWARDS, DONOR_ADV, np.zeros(4), np.array([True, True, False, False]))
    np.testing.assert_allclose(out, [1 / np.sqrt(2), -1 / np.sqrt(2), 0, 0], atol=1e-5)
    # fewer than two admitted, or all alike: nothing to centre on
    assert not recentered_advantages(DONOR_REWARDS, DONOR_ADV, None, np.array([True, False, False, False])).any()
    assert not recentered_advantages(DONOR_REWARDS, DONOR_ADV, None, np.array([False, True, True, False])).any()


def test_success_only_offers_the_correct_responses():
    np.testing.assert_array_equal(offered_responses("success", DONOR_REWARDS), [True, False, False, False])
    assert offered_responses("all", DONOR_REWARDS).all()


def test_group_gate_admits_all_or_none_on_the_mean_s():
    offered = np.ones(3, bool)
    np.testing.assert_allclose(gate(np.array([0.9, 0.7, 1.1]), 0.8, "group", offered), [0.9] * 3)
    np.testing.assert_array_equal(gate(np.array([0.9, 0.5, 0.6]), 0.8, "group", offered), [0.0] * 3)
    # the mean is over offered responses only; the others get 0
    np.testing.assert_allclose(gate(np.array([1.3, 0.1, 0.1]), 0.8, "group", np.array([True, False, False])),
                               [1.0, 0.0, 0.0])
    np.testing.assert_allclose(gate(np.array([0.9, 0.7, 1.1]), 0.8, "response", offered), [0.9, 0.0, 1.0])


def test_peer_transfer_admits_and_names_bad_settings():
    receiver_mean = np.log([0.9, 0.5, 0.95, 0.2])  # s = exp(l_B - l_A) with l_A = 0
    taken = PeerTransfer(peer_responses="success").admit(GateInputs(receiver_mean, np.zeros(4)), DONOR_REWARDS,
                                                         DONOR_ADV, np.zeros(4))
    np.testing.assert_allclose(taken.s, [0.9, 0.5, 0.95, 0.2])
    np.testing.assert_array_equal(taken.offered, [True, False, False, False])
    np.testing.assert_allclose(taken.w, [0.9, 0, 0, 0])  # the correct response only
    np.testing.assert_array_equal(taken.advantages, DONOR_ADV)
    taken = PeerTransfer(gate=False).admit(GateInputs(np.array([-np.inf, 0, 0, 0]), np.zeros(4)), DONOR_REWARDS,
                                           DONOR_ADV, np.zeros(4))
    np.testing.assert_array_equal(taken.w, [0, 1, 1, 1])  # no gate, but an empty re-tokenisation carries nothing
    with pytest.raises(ValueError, match="exchange.peer_advantages"):
        PeerTransfer(peer_advantages="nope")
    with pytest.raises(ValueError, match="exchange.gate_scope"):
        PeerTransfer(gate_scope="nope")
    with pytest.raises(ValueError, match="exchange.peer_responses"):
        PeerTransfer(peer_responses="nope")


def test_group_scope_gives_a_nan_score_the_groups_weight():
    """algorithm.md's gate_scope / gate_kind: a NaN s admits nothing per response; under
    ``group`` it leaves the mean and takes the group's w like every offered response."""
    scores, offered = np.array([0.9, np.nan, 0.95]), np.ones(3, dtype=bool)
    assert gate(scores, 0.8, "response", offered).tolist() == [0.9, 0.0, 0.95]
    assert gate(scores, 0.8, "group", offered) == pytest.approx([0.925] * 3)
