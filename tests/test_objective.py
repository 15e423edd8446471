"""GRPO advantages (Eq. 1), the GRAFT policy loss (Eqs. 2, 3, 9, 10) and the SGT term."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.receiver.objective import grpo_advantages, policy_loss, sgt_loss

EPS_LOW, EPS_HIGH = 0.2, 0.28


# --- Eq. 1 ---------------------------------------------------------------------------


def test_advantages_hand_computed_n4():
    # mean 0.25, unbiased std sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    adv = grpo_advantages(torch.tensor([[1.0, 0.0, 0.0, 0.0]]))
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25]]) / (0.5 + 1e-6)
    torch.testing.assert_close(adv, expected)


def test_advantages_n2_is_plus_minus_one_over_sqrt2():
    adv = grpo_advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    torch.testing.assert_close(adv, torch.tensor([[s, -s], [-s, s]]))


def test_advantages_zero_variance_groups_are_zero():
    rewards = torch.tensor([[0.0] * 8, [1.0] * 8, [1.0, 0, 0, 0, 0, 0, 0, 0]])
    adv = grpo_advantages(rewards)
    assert torch.all(adv[0] == 0) and torch.all(adv[1] == 0)
    assert adv[2, 0] > 0 and torch.all(adv[2, 1:] < 0)


def test_advantages_single_response_group_is_zero():
    assert torch.all(grpo_advantages(torch.tensor([[1.0], [0.0]])) == 0)


def test_advantages_reject_wrong_rank():
    with pytest.raises(ValueError, match="groups, n"):
        grpo_advantages(torch.tensor([1.0, 0.0]))


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0]), min_size=8, max_size=8), min_size=1, max_size=6))
def test_advantages_sum_to_zero_and_unit_unbiased_std(groups):
    rewards = torch.tensor(groups)
    adv = grpo_advantages(rewards)
    torch.testing.assert_close(adv.sum(dim=1), torch.zeros(len(groups)), atol=1e-4, rtol=0)
    mixed = (rewards.sum(1) > 0) & (rewards.sum(1) < 8)
    if mixed.any():
        std = adv[mixed].std(dim=1, unbiased=True)
        torch.testing.assert_close(std, torch.ones_like(std), atol=1e-4, rtol=0)


# --- Eq. 10 --------------------------------------------------------------------------


def test_policy_loss_on_policy_is_weighted_token_mean_of_advantages():
    # rho = 1 everywhere: J = (1 * 1 * 2 tokens + 0.5 * (-1) * 1 token) / 3 tokens = 0.5
    logp = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp, torch.tensor([1.0, -1.0]), torch.tensor([1.0, 0.5]), mask)
    assert loss.item() == pytest.approx(-0.5)
    assert stats["clip_frac"] == 0.0
    assert stats["n_tokens"] == 3.0


def test_policy_loss_clips_asymmetrically():
    # Four tokens, one per response, a = +1, -1, +1, -1 and rho = 1.5, 0.5, 0.5, 1.5.
    #   a>0, rho 1.5 -> clipped to 1.28 (clip active)
    #   a<0, rho 0.5 -> min(-0.5, -0.8) = -0.8 (clip active)
    #   a>0, rho 0.5 -> min(0.5, 0.8) = 0.5 (unclipped)
    #   a<0, rho 1.5 -> min(-1.5, -1.28) = -1.5 (unclipped)
    rho = torch.tensor([[1.5], [0.5], [0.5], [1.5]])
    logp = torch.log(rho)
    old = torch.zeros(4, 1)
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, stats = policy_loss(logp, old, adv, torch.ones(4), torch.ones(4, 1),
                              is_peer=torch.tensor([False, False, True, True]))
    expected_j = (1.28 - 0.8 + 0.5 - 1.5) / 4
    assert loss.item() == pytest.approx(-expected_j, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["own_clip_frac"] == pytest.approx(1.0)
    assert stats["peer_clip_frac"] == pytest.approx(0.0)


def test_policy_loss_denominator_counts_tokens_unweighted():
    logp = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    loss, _ = policy_loss(logp, logp, torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]), mask)
    assert loss.item() == pytest.approx(-3 / 6)


def test_policy_loss_ignores_padding():
    logp = torch.tensor([[0.3, 99.0]])
    old = torch.tensor([[0.0, -99.0]])
    loss, stats = policy_loss(logp, old, torch.tensor([-1.0]), torch.ones(1), torch.tensor([[1.0, 0.0]]))
    assert loss.item() == pytest.approx(math.exp(0.3))
    assert stats["n_tokens"] == 1.0


def _reference_surrogate(logp, old, adv, mask):
    """Eq. 2 token by token, the plain GRPO surrogate (no weights)."""
    total, count = 0.0, 0
    for j in range(len(logp)):
        for t in range(len(logp[0])):
            if mask[j][t]:
                rho = math.exp(logp[j][t] - old[j][t])
                clipped = min(max(rho, 1 - EPS_LOW), 1 + EPS_HIGH)
                total += min(rho * adv[j], clipped * adv[j])
                count += 1
    return -total / max(count, 1)


batches = st.integers(1, 4).flatmap(
    lambda b: st.integers(1, 5).flatmap(
        lambda t: st.tuples(
            st.lists(st.lists(st.floats(-1.0, 1.0), min_size=t, max_size=t), min_size=b, max_size=b),
            st.lists(st.lists(st.floats(-1.0, 1.0), min_size=t, max_size=t), min_size=b, max_size=b),
            st.lists(st.floats(-2.0, 2.0), min_size=b, max_size=b),
            st.lists(st.lists(st.booleans(), min_size=t, max_size=t), min_size=b, max_size=b),
        )
    )
)


def _away_from_clip_edges(logp, old):
    rho = np.exp(np.asarray(logp) - np.asarray(old))
    return np.all(np.abs(rho - (1 - EPS_LOW)) > 1e-4) and np.all(np.abs(rho - (1 + EPS_HIGH)) > 1e-4)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_policy_loss_with_unit_weights_is_plain_grpo_surrogate(batch):
    logp, old, adv, mask = batch
    loss, _ = policy_loss(torch.tensor(logp, dtype=torch.float64), torch.tensor(old, dtype=torch.float64),
                          torch.tensor(adv, dtype=torch.float64), torch.ones(len(adv), dtype=torch.float64),
                          torch.tensor(mask, dtype=torch.float64))
    assert loss.item() == pytest.approx(_reference_surrogate(logp, old, adv, mask), abs=1e-9)


@settings(max_examples=150, deadline=None)
@given(batches, st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4))
def test_policy_loss_gradient_matches_analytic(batch, weight_pool):
    logp, old, adv, mask = batch
    if not _away_from_clip_edges(logp, old):
        return
    b = len(adv)
    w = torch.tensor(weight_pool[:b], dtype=torch.float64)
    logp_t = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    old_t = torch.tensor(old, dtype=torch.float64)
    adv_t = torch.tensor(adv, dtype=torch.float64)
    mask_t = torch.tensor(mask, dtype=torch.float64)
    loss, _ = policy_loss(logp_t, old_t, adv_t, w, mask_t)
    loss.backward()
    # d(-J)/d logp_{j,t} = -(w_j / N) * rho * a_j where the unclipped branch is the min, else 0
    rho = torch.exp(logp_t.detach() - old_t)
    unclipped = rho * adv_t[:, None]
    clipped = rho.clamp(1 - EPS_LOW, 1 + EPS_HIGH) * adv_t[:, None]
    active = (unclipped <= clipped).double()
    n_tokens = mask_t.sum().clamp_min(1)
    analytic = -(w[:, None] * active * rho * adv_t[:, None] * mask_t) / n_tokens
    torch.testing.assert_close(logp_t.grad, analytic, atol=1e-10, rtol=1e-8)


def test_policy_loss_weights_and_advantages_get_no_gradient():
    adv = torch.tensor([1.0], requires_grad=True)
    w = torch.tensor([0.9], requires_grad=True)
    logp = torch.zeros(1, 2, requires_grad=True)
    loss, _ = policy_loss(logp, torch.zeros(1, 2), adv, w, torch.ones(1, 2))
    loss.backward()
    assert adv.grad is None and w.grad is None and logp.grad is not None


# --- SGT -----------------------------------------------------------------------------


def test_sgt_loss_is_coef_times_mean_token_nll():
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.5, 1.0]]))
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # response 1: (ln2 + ln4) / 2 = 1.5 ln2 ; response 2: ln2 ; mean 1.25 ln2
    assert sgt_loss(logp, mask, coef=0.1).item() == pytest.approx(0.1 * 1.25 * math.log(2))


def test_sgt_loss_of_nothing_is_zero():
    assert sgt_loss(torch.zeros(0, 3), torch.zeros(0, 3)).item() == 0.0
