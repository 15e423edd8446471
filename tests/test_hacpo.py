"""HACPO (policies/hacpo.py, workers/receiver/objective.py ``sequence``): every mechanism on cases
computed by hand, the loss's gradient against its analytic form, and a real trainer taking
peer groups own-first with the cross ratio of the receiver's re-tokenisation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from graftpool.contracts import OWN, PEER, ExchangeInput
from policies import make_policy
from policies.hacpo import baselines, capability_ratios, hacpo_advantages
from tests.tiny_pair import batch_of, per_group, prepared
from workers.receiver.objective import (
    SequenceObjective,
    grpo_advantages,
    lower_bound,
    sequence_policy_loss,
)
from workers.training.trainer import TorchTrainer

SIGMA = math.sqrt(2 / 7)  # unbiased std of [1,0,0,0, 1,1,1,0]


def _inp(rewards: np.ndarray) -> ExchangeInput:
    rewards = np.asarray(rewards, dtype=float)
    return ExchangeInput(models=[f"m{i}" for i in range(rewards.shape[0])],
                         prompt_ids=[f"q{i}" for i in range(rewards.shape[1])], rewards=rewards)


# -- capability-aware advantages (HACPO Eq. 6-10) ---------------------------------------

def test_capability_is_the_mean_reward_over_a_window_of_five_steps_including_this_one():
    policy = make_policy("hacpo")
    for step in range(1, 8):  # model 0's mean reward is step/8; model 1's is 1/2
        rewards = np.zeros((2, 1, 8))
        rewards[0, 0, :step] = 1
        rewards[1, 0, :4] = 1
        policy.plan(_inp(rewards))
        window = [s / 8 for s in range(max(1, step - 4), step + 1)]
        np.testing.assert_allclose(policy.transfer.capability(), [np.mean(window), 0.5])
    state = policy.state_dict()
    again = make_policy("hacpo")
    again.load_state_dict(state)
    np.testing.assert_allclose(again.transfer.capability(), policy.transfer.capability())


def test_advantages_by_hand_in_both_discrepancy_directions():
    """A: [1,0,0,0] (P_A = 1/4), B: [1,1,1,0] (P_B = 3/4) on the one prompt of the step.
    mu^A = (1 + (1/3) 3) / 8 = 1/4, mu^B = (3 * 1 + 3) / 8 = 3/4, sigma = sqrt(2/7).
    A's peer responses (from the stronger B) are scaled by w^(B,A) = 3; B's (from the weaker A)
    by w^(A,B) = 1/3."""
    policy = make_policy("hacpo")
    routes = policy.plan(_inp([[[1, 0, 0, 0]], [[1, 1, 1, 0]]]))
    got = {(r.donor, r.receiver, r.kind): np.array(r.advantages) for r in routes}
    assert set(got) == {(0, 0, OWN), (1, 1, OWN), (1, 0, PEER), (0, 1, PEER)}
    hi, lo = 0.75 / SIGMA, -0.25 / SIGMA  # learner A: R - 1/4
    np.testing.assert_allclose(got[(0, 0, OWN)], [hi, lo, lo, lo], rtol=1e-5)
    np.testing.assert_allclose(got[(1, 0, PEER)], [3 * hi, 3 * hi, 3 * hi, 3 * lo], rtol=1e-5)
    hi_b, lo_b = 0.25 / SIGMA, -0.75 / SIGMA  # learner B: R - 3/4
    np.testing.assert_allclose(got[(1, 1, OWN)], [hi_b, hi_b, hi_b, lo_b], rtol=1e-5)
    np.testing.assert_allclose(got[(0, 1, PEER)], [hi_b / 3, lo_b / 3, lo_b / 3, lo_b / 3], rtol=1e-5)
    # the Table 3 ablation: without the coefficient a peer response gets the learner-baseline A
    plain = hacpo_advantages(np.array([[1, 0, 0, 0], [1, 1, 1, 0]]), np.array([0.25, 0.75]), peer_coefficient=False)
    np.testing.assert_allclose(plain[0, 1], [hi, hi, hi, lo], rtol=1e-5)
    # Eq. 10 read literally: the peer's advantage from the source's baseline mu^(j)
    source = hacpo_advantages(np.array([[1, 0, 0, 0], [1, 1, 1, 0]]), np.array([0.25, 0.75]),
                              peer_baseline="source")
    np.testing.assert_allclose(source[0, 1], 3 * np.array([hi_b, hi_b, hi_b, lo_b]), rtol=1e-5)


def test_two_identical_agents_have_the_joint_group_mean_as_baseline():
    """Capability ratio 1: mu^(k) is the plain mean of the nG rewards, and every advantage is
    Eq. 1 over the joint group (the coefficient is 1 as well)."""
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, size=(2, 8)).astype(float)
    rewards[0, 0], rewards[1, 0] = 1, 0  # not uniform
    w = capability_ratios(np.array([0.4, 0.4]))
    np.testing.assert_allclose(baselines(rewards, w), [rewards.mean()] * 2)
    adv = hacpo_advantages(rewards, np.array([0.4, 0.4]))
    joint = grpo_advantages(torch.tensor(rewards.reshape(1, -1))).numpy().reshape(2, 8)
    for k in range(2):
        np.testing.assert_allclose(adv[k], joint, rtol=1e-5, atol=1e-6)


def test_ratio_clamp_and_guards():
    np.testing.assert_allclose(capability_ratios(np.array([0.01, 0.5])), [[1, 0.1], [10, 1]])
    np.testing.assert_allclose(capability_ratios(np.array([0.01, 0.5]), None), [[1, 0.02], [50, 1]])
    # every reward equal: A = 0 whatever the capabilities
    assert not hacpo_advantages(np.zeros((2, 4)), np.array([0.1, 0.9])).any()
    # mu^(B) = (10 * 4 + 3) / 8 > 1: B's baseline falls back to its own mean, 3/4
    w = capability_ratios(np.array([0.1, 1.0]))
    mu = baselines(np.array([[1, 1, 1, 1], [1, 1, 1, 0]]), w)
    assert mu[1] == pytest.approx(0.75)
    assert mu[0] == pytest.approx((4 + 0.1 * 3) / 8)


def test_three_agents_use_the_general_formulas():
    """N = 3: mu^(k) sums over all three groups with w^(k,j); each peer is scaled by w^(j,k)."""
    rewards = np.array([[1, 0], [1, 1], [0, 0]], dtype=float)
    cap = np.array([0.5, 1.0, 0.25])
    adv = hacpo_advantages(rewards, cap)
    sigma = rewards.std(ddof=1)
    for k in range(3):
        mu = sum(min(max(cap[k] / cap[j], 0.1), 10) * rewards[j].sum() for j in range(3)) / 6
        for j in range(3):
            coef = 1.0 if j == k else cap[j] / cap[k]
            np.testing.assert_allclose(adv[k, j], coef * (rewards[j] - mu) / (sigma + 1e-6), rtol=1e-6)


def test_bad_parameters_name_the_field():
    with pytest.raises(ValueError, match="exchange.params.peer_baseline"):
        make_policy("hacpo", peer_baseline="mean")
    with pytest.raises(ValueError, match="exchange.params.normalization"):
        make_policy("hacpo", normalization="token")
    with pytest.raises(ValueError, match="stored donors"):
        make_policy("hacpo").plan(ExchangeInput(["a", "b"], ["q"], np.zeros((2, 1, 2)), live=[True, False]))


# -- the sequence-level loss (HACPO Eq. 11-14, App. E Eq. 47-53) ------------------------

def _peer_loss(logp: list[float], source: float, adv: float, alpha: float, lower: float = 0.8):
    logp_t = torch.tensor([logp], dtype=torch.float64, requires_grad=True)
    loss, stats = sequence_policy_loss(logp_t, torch.zeros_like(logp_t), torch.ones_like(logp_t),
                                       torch.tensor([adv], dtype=torch.float64), torch.tensor([True]),
                                       torch.tensor([source], dtype=torch.float64), lower=lower, alpha=alpha)
    loss.backward()
    return float(loss.detach()), logp_t.grad[0].numpy(), stats


@pytest.mark.parametrize("alpha", [0.0, 3.0])
def test_peer_ratio_with_alpha(alpha):
    """s = exp(mean(-1, -2) - (-1.4)) = exp(-0.1); J = s * s^alpha * A, and dJ/dlogp_t =
    s^(1+alpha) A / |y|."""
    s = math.exp(-0.1)
    loss, grad, stats = _peer_loss([-1.0, -2.0], -1.4, 2.0, alpha)
    assert float(stats["ratio"][0]) == pytest.approx(s)
    assert loss == pytest.approx(-(s ** (1 + alpha)) * 2.0)
    np.testing.assert_allclose(grad, [-(s ** (1 + alpha)) * 2.0 / 2] * 2)
    assert float(stats["weight"][0]) == pytest.approx(s ** (1 + alpha))


@pytest.mark.parametrize("source", [-1.2, -1.6], ids=["below-lb", "above-1"])
def test_a_peer_outside_lb_and_1_gets_no_gradient(source):
    """s = exp(-0.3) = 0.74 < lb = 0.8, or s = exp(0.1) > 1: the clamp is flat there."""
    _, grad, stats = _peer_loss([-1.0, -2.0], source, 2.0, 1.0)
    assert not grad.any()
    assert bool(stats["clipped"][0]) and float(stats["weight"][0]) == 0.0


def test_lb_rises_by_delta_step_per_minibatch():
    """A peer with s = 0.84 is trained by updates m = 0 (lb 0.8) and 1 (0.825), not by m = 2
    (0.85); lb_m stops at 1."""
    assert [lower_bound(m) for m in range(3)] == pytest.approx([0.8, 0.825, 0.85])
    assert lower_bound(100) == 1.0
    objective = SequenceObjective(lb=0.8, delta_step=0.025, alpha=1.0)
    from workers.receiver.objective import RowConstants

    source = -1.5 - math.log(0.84)
    got = []
    for m in range(3):
        logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
        rows = RowConstants(torch.tensor([1.0]), torch.tensor([1.0]), torch.tensor([True]), torch.tensor([source]))
        terms = objective(logp, logp.detach(), torch.ones_like(logp), rows, m, 1.0)
        terms.loss.backward()
        got.append(bool(logp.grad.abs().sum() > 0))
        assert float(terms.ratio[0]) == pytest.approx(0.84, rel=1e-5)
    assert got == [True, True, False]


def test_own_rows_use_the_gspo_clip():
    """Own: s = exp(mean(logp - old)). s = e^0.0001 is inside [1 - 3e-4, 1 + 4e-4]: gradient
    A s / |y|; s = e^0.001 with A > 0 is clipped (no gradient), with A < 0 it is not (min)."""
    def own(shift: float, adv: float):
        logp = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
        loss, stats = sequence_policy_loss(logp, logp.detach() - shift, torch.ones_like(logp),
                                           torch.tensor([adv], dtype=torch.float64), torch.tensor([False]),
                                           torch.tensor([float("nan")], dtype=torch.float64))
        loss.backward()
        return logp.grad[0].numpy(), bool(stats["clipped"][0])

    grad, clipped = own(1e-4, 1.0)
    np.testing.assert_allclose(grad, [-math.exp(1e-4) / 2] * 2)
    assert not clipped
    grad, clipped = own(1e-3, 1.0)
    assert not grad.any() and clipped
    grad, clipped = own(1e-3, -1.0)
    np.testing.assert_allclose(grad, [math.exp(1e-3) / 2] * 2)


def test_autograd_gradient_equals_the_analytic_gradient():
    """A batch of own and peer rows of different lengths: dL/dlogp_{i,t} equals, with D the
    denominator, -A_i s_i / (|y_i| D) for an own row whose unclipped branch is active (else 0)
    and -A_i s_i^(1+alpha) / (|y_i| D) for a peer inside [lb, 1] (else 0)."""
    rng = np.random.default_rng(3)
    b, t, alpha, lower, denominator = 12, 6, 1.5, 0.8, 7.0
    logp = torch.tensor(-rng.uniform(0.5, 2.0, (b, t)), requires_grad=True)
    old = logp.detach() + torch.tensor(rng.normal(0, 4e-4, (b, t)))
    lengths = rng.integers(1, t + 1, b)
    mask = torch.tensor((np.arange(t)[None, :] < lengths[:, None]).astype(float))
    adv = torch.tensor(rng.normal(0, 1, b))
    peer = torch.tensor([i % 2 == 1 for i in range(b)])
    own_mean = ((logp.detach() * mask).sum(1) / mask.sum(1)).numpy()
    source = torch.tensor(own_mean - np.log(rng.uniform(0.6, 1.2, b)))
    loss, stats = sequence_policy_loss(logp, old, mask, adv, peer, source, lower, alpha, denominator=denominator)
    loss.backward()
    s = stats["ratio"].numpy()
    expected = np.zeros((b, t))
    for i in range(b):
        a = float(adv[i])
        if peer[i]:
            g = -a * s[i] ** (1 + alpha) if lower <= s[i] <= 1 else 0.0
        else:
            unclipped_active = s[i] * a <= np.clip(s[i], 1 - 3e-4, 1 + 4e-4) * a
            g = -a * s[i] if unclipped_active else 0.0
        expected[i, : lengths[i]] = g / (lengths[i] * denominator)
    np.testing.assert_allclose(logp.grad.numpy(), expected, rtol=1e-6, atol=1e-12)
    assert 0 < stats["clipped"][peer].sum() < peer.sum(), "some peers in range, some out"


def test_normalisation_group_counts_g_per_prompt():
    group = SequenceObjective(group_size=4)
    assert group.normaliser([3] * 8, ["a"] * 8) == 4  # own + peer rows of one prompt: 1/G each
    assert group.normaliser([3] * 8, ["a"] * 4 + ["b"] * 4) == 8
    assert SequenceObjective(normalization="sequence").normaliser([3] * 8, ["a"] * 8) == 8


# -- a real trainer ------------------------------------------------------------------------

def test_trainer_takes_peer_groups_own_first_with_the_receivers_cross_ratio(paths, rollouts):  # noqa: F811
    """gpt2-bpe learns from its own groups and llama-char's groups of the same prompts. With a
    learning rate of 1e-12 the weights do not move, so each peer's s at its update must equal
    exp(receiver's mean log-likelihood of its own re-tokenisation, scored separately before
    training, - the source's mean): the cross ratio of HACPO Eq. 11. Updates: 2 own, then 2
    peer (lb 0.85 and 0.875); a peer trained has s in [0.85, 1] and weight s^(1 + alpha)."""
    _, groups = rollouts
    source = TorchTrainer(paths["llama-char"], lr=1e-12, minibatches=4)
    for group in groups["llama-char"]:
        group.mean_logp = np.asarray(source.score(group.record())["mean_logp"])
    learner = TorchTrainer(paths["gpt2-bpe"], lr=1e-12, minibatches=4, seed=0)
    policy = make_policy("hacpo", alpha=1.0)
    peers = [(g, list(g.advantages)) for g in groups["llama-char"]]
    expected_s = [np.exp(np.asarray(learner.score_peers(g.record())["mean"]) - g.mean_logp)
                  for g in groups["llama-char"]]
    batch = prepared(learner.score, batch_of(groups["gpt2-bpe"], peers=peers))
    result = learner.train(batch, policy.objective(4))
    assert [u.kind for u in result.minibatches] == ["own", "own", "peer", "peer"]
    s = np.concatenate(per_group(batch, result, PEER, "compat"))
    w = np.concatenate(per_group(batch, result, PEER, "weight"))
    np.testing.assert_allclose(s, np.concatenate(expected_s), rtol=1e-4)
    trained = w > 0
    assert trained.any() and (~trained).any()
    assert np.all((s[trained] >= 0.85) & (s[trained] <= 1.0))
    np.testing.assert_allclose(w[trained], s[trained] ** 2, rtol=1e-5)
    assert np.all((s[~trained] < 0.875) | (s[~trained] > 1.0))
    assert result.metrics["train/peer_clip_frac"] == pytest.approx(1 - trained.mean())


def test_the_clip_floor_counts_on_through_a_steps_epochs(paths, rollouts):  # noqa: F811
    """m is the update's index in the step (docs/algorithm.md, HACPO Eq. 13-14), not in its
    epoch: with 4 minibatches and 2 epochs the second epoch's peer updates are m = 6 and 7, whose
    floor lb + m * delta_step (0.5 + 0.1 m) is 1, so no peer with s < 1 gets a gradient there. Counted
    per epoch they were m = 2 and 3 again (floors 0.7, 0.8), training peers the docs' floor refuses.
    ``weight`` and ``compat`` are the last epoch's."""
    _, groups = rollouts
    source = TorchTrainer(paths["llama-char"], lr=1e-12, minibatches=4)
    for group in groups["llama-char"]:
        group.mean_logp = np.asarray(source.score(group.record())["mean_logp"])
    learner = TorchTrainer(paths["gpt2-bpe"], lr=1e-12, minibatches=4, epochs=2, seed=0)
    policy = make_policy("hacpo", alpha=1.0, lb=0.5, delta_step=0.1)
    peers = [(g, list(g.advantages)) for g in groups["llama-char"]]
    batch = prepared(learner.score, batch_of(groups["gpt2-bpe"], peers=peers))
    result = learner.train(batch, policy.objective(4))
    assert [u.kind for u in result.minibatches] == ["own", "own", "peer", "peer"] * 2
    s = np.concatenate(per_group(batch, result, PEER, "compat"))
    w = np.concatenate(per_group(batch, result, PEER, "weight"))
    assert ((s >= 0.8) & (s < 1.0)).any()  # peers the per-epoch floors would have trained
    assert not (w[s < 1.0] > 0).any(), f"peers with s < 1 trained at floor < 1: s {s[(w > 0) & (s < 1.0)]}"


def test_peer_push_counts_the_peers_admitted_at_their_update_with_their_weight(paths, rollouts):  # noqa: F811
    """``exchange/peer_push`` = sum_j w_j a_j over the admitted peer rows (docs/metrics.md): under
    HACPO a peer's w is known at its update only (s^(1 + alpha) inside [lb_m, 1], else 0), so it is
    summed from the rows as trained, not from their loss weight 1 before the update, which counted
    every peer row offered, those outside the window included (a 3-model run logged a push of 6.0
    where its one admitted peer had advantage 0)."""
    _, groups = rollouts
    source = TorchTrainer(paths["llama-char"], lr=1e-12, minibatches=4)
    for group in groups["llama-char"]:
        group.mean_logp = np.asarray(source.score(group.record())["mean_logp"])
    learner = TorchTrainer(paths["gpt2-bpe"], lr=1e-12, minibatches=4, seed=0)
    peers = [(g, list(g.advantages)) for g in groups["llama-char"]]
    batch = prepared(learner.score, batch_of(groups["gpt2-bpe"], peers=peers))
    result = learner.train(batch, make_policy("hacpo", alpha=1.0).objective(4))
    w = np.concatenate(per_group(batch, result, PEER, "weight"))
    a = np.concatenate(per_group(batch, result, PEER, "trained_advantage"))
    assert (w == 0).any() and (a[w == 0] != 0).any(), "some peers with an advantage are outside the window"
    assert result.metrics["exchange/peer_push"] == pytest.approx(float(np.sum(w * a)), abs=1e-9)
    assert result.metrics["exchange/peer_push_abs"] == pytest.approx(float(np.sum(w * np.abs(a))), abs=1e-9)


def test_a_step_not_taken_trains_none_of_its_peers(paths, rollouts):  # noqa: F811
    """A minibatch whose summed gradient's norm is not finite takes no step (either backend:
    ``train/nonfinite_grad_steps``), so its peer rows were not trained: s NaN and weight 0, as a
    skipped micro-batch's, and no part of ``exchange/peer_push``. Before, their s and weight at the
    forward stayed: the store and the push counted HACPO peers admitted into an update never made."""
    _, groups = rollouts
    source = TorchTrainer(paths["llama-char"], lr=1e-12, minibatches=4)
    for group in groups["llama-char"]:
        group.mean_logp = np.asarray(source.score(group.record())["mean_logp"])
    learner = TorchTrainer(paths["gpt2-bpe"], lr=1e-12, minibatches=4, seed=0)
    learner._optimizer_step = lambda: float("nan")  # every minibatch's norm not finite: no step taken
    peers = [(g, list(g.advantages)) for g in groups["llama-char"]]
    batch = prepared(learner.score, batch_of(groups["gpt2-bpe"], peers=peers))
    result = learner.train(batch, make_policy("hacpo", alpha=1.0).objective(4))
    assert result.metrics["train/nonfinite_grad_steps"] == 4 and not result.minibatches
    w = np.concatenate(per_group(batch, result, PEER, "weight"))
    s = np.concatenate(per_group(batch, result, PEER, "compat"))
    assert np.all(w == 0) and np.all(np.isnan(s)), f"peers counted as trained: w {w[w != 0]}"
    assert result.metrics["exchange/peer_push"] == 0.0 and result.metrics["exchange/peer_push_abs"] == 0.0
