"""The exchange options beyond the paper (issue #28) and the step diagnostics, on formulas and
on the real trainer with the demo pair's tiny models: LUFFY's shaped peer ratio, asymmetric
peer advantages, the step-wide loss normaliser, spread peer placement, SGT inside the RL
minibatch, the net peer push and the own / peer split of each update's gradient."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from graftpool.contracts import SGT
from graftpool.step_record import StepRecord
from tests.tiny_pair import batch_of, grafts_for, made_mixed, own_updates, prepared
from workers.receiver.objective import (
    StepTokens,
    TokenObjective,
    policy_loss,
    shaped_surrogate,
)
from workers.receiver.peer_transfer import PeerAdvantageParams, PeerTransfer, asymmetric_advantages
from workers.training.diagnostics import peer_push, update_metrics
from workers.training.trainer import TorchTrainer, Update

ARGS = dict(lr=1e-3, seed=0)


def test_shaped_ratio_has_luffys_gradient_and_leaves_own_rows_alone():
    """d/dlogp [pi / (pi + gamma) a] = a gamma pi / (pi + gamma)^2 on peer tokens, no clip; own
    rows keep Eq. 10's clipped term."""
    logp = torch.log(torch.tensor([[0.05, 0.5], [0.9, 0.3]], dtype=torch.float64)).requires_grad_()
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]], dtype=torch.float64))  # own row: rho = 0.1 .. 1.8
    adv, gamma = torch.tensor([1.5, 1.5], dtype=torch.float64), 0.1
    mask = torch.ones(2, 2, dtype=torch.float64)
    is_peer = torch.tensor([True, False])
    loss, stats = policy_loss(logp, old, adv, torch.ones(2, dtype=torch.float64), mask, is_peer=is_peer,
                              peer_ratio="shaped", shaping_gamma=gamma)
    loss.backward()
    p = torch.exp(logp.detach())
    expected_peer = -(1.5 * gamma * p[0] / (p[0] + gamma) ** 2) / 4
    torch.testing.assert_close(logp.grad[0], expected_peer)
    reference = logp.detach().clone().requires_grad_()
    own_loss, _ = policy_loss(reference, old, adv, torch.ones(2, dtype=torch.float64), mask)
    own_loss.backward()
    torch.testing.assert_close(logp.grad[1], reference.grad[1])  # the own row: Eq. 10 unchanged
    assert stats["peer_clip_frac"] == 0.0 and stats["own_clip_frac"] > 0  # rho = 1.8 clips there
    surrogate, clipped = shaped_surrogate(torch.log(torch.tensor([[0.1]])), torch.zeros(1, 1),
                                          torch.tensor([[2.0]]), 0.2, 0.28, 0.1)
    assert float(surrogate) == pytest.approx(1.0) and not clipped.any()  # f(0.1) = 0.5


def test_asymmetric_advantages_scale_only_the_negative_ones():
    adv = np.array([1.2, -0.4, -0.4, 0.0])
    out = asymmetric_advantages(None, adv, None, np.ones(4, bool), PeerAdvantageParams(beta=0.25))
    np.testing.assert_allclose(out, [1.2, -0.1, -0.1, 0.0])
    np.testing.assert_allclose(asymmetric_advantages(None, adv, None, None, PeerAdvantageParams(1.0)), adv)
    with pytest.raises(ValueError, match="exchange.peer_beta"):
        PeerTransfer(peer_advantages="asymmetric", peer_beta=1.5)


def test_step_normaliser_divides_every_minibatch_by_the_steps_mean_token_count():
    step = StepTokens(tokens=1200, minibatches=4)
    assert TokenObjective(loss_normalizer="step").normaliser([50] * 2, ["a", "b"], step) == 300
    assert TokenObjective().normaliser([50] * 2, ["a", "b"], step) == 100  # the paper: its own tokens
    with pytest.raises(ValueError, match="algorithm.loss_normalizer"):
        TokenObjective(loss_normalizer="global")


def test_peer_push_and_update_metrics():
    from graftpool.step_record import StepRecord

    rows = StepRecord.from_rows({"trained_advantage": a, "weight": w, "peer": p, "term": "policy"}
                                for a, w, p in ((1.0, 1.0, False), (1.5, 0.9, True), (-0.5, 1.0, True), (-0.5, 0.85, True)))
    push = peer_push(rows, "policy")
    assert push["exchange/peer_push"] == pytest.approx(1.35 - 0.5 - 0.425)
    assert push["exchange/peer_push_abs"] == pytest.approx(1.35 + 0.5 + 0.425)
    updates = [Update("own", 10, 0.1, 100, 2.0, 2.0, 0.0), Update("mixed", 12, 0.1, 120, 1.5, 1.0, 1.0),
               Update("peer", 3, 0.1, 30, 3.0, 0.0, 3.0)]
    metrics = update_metrics(updates)
    assert metrics["train/peer_grad_share"] == pytest.approx(4.0 / 7.0)  # (0 + 1 + 3) / (2 + 2 + 3)
    assert (metrics["train/updates_own"], metrics["train/updates_mixed"], metrics["train/updates_peer"]) == (1, 1, 1)
    assert metrics["train/update_2/kind"] == 2 and metrics["train/update_1/tokens"] == 120


def test_spread_step_trainer_takes_no_peer_only_update(paths, rollouts):
    """One group per minibatch: ``last`` ends the step with peer-only updates; ``spread`` takes
    one update per own group, each opening with own rows, the grafts in the last ones."""
    _, groups = rollouts
    own, grafts = groups["gpt2-bpe"], grafts_for("gpt2-bpe", "llama-char", groups)
    assert len(grafts) >= 2, "gpt2-bpe should fail some prompts llama-char has mixed groups on"
    kinds = {}
    for placement in ("last", "spread"):
        trainer = TorchTrainer(paths["gpt2-bpe"], minibatches=len(own), minibatch_split="groups", gate=False,
                               peer_placement=placement, loss_normalizer="step", **ARGS)
        result = trainer.train(prepared(trainer.score, batch_of(own, grafts)))
        kinds[placement] = [u.kind for u in result.minibatches]
        assert sum(u.tokens for u in result.minibatches) == \
            result.metrics["train/own_tokens"] + result.metrics["train/peer_tokens"]
    assert kinds["last"][-len(grafts):] == ["peer"] * len(grafts)
    assert "peer" not in kinds["spread"] and len(kinds["spread"]) == len(own) - len(grafts)
    assert kinds["spread"][-len(grafts):] == ["mixed"] * len(grafts)


def test_rows_split_keeps_the_update_count_when_the_gate_drops_every_graft(paths, rollouts):
    """The gate closed (delta huge) or open (no gate): with it closed the grafts replace their own groups and none of their rows is
    trained. Cut by rows, the step still takes ``minibatches`` updates of near-equal row counts;
    cut by groups, the grafts' empty slots cost updates (the control takes fewer steps than the
    row it controls), and with the gate open the last group minibatch is peer-only."""
    _, groups = rollouts
    # the donor's group on each of gpt2-bpe's all-fail prompts, made mixed where the sample left it
    # uniform: how many of llama-char's sampled groups are mixed there depends on the CPU's kernels
    # (two on an AVX512-BF16 EPYC, three or more on an AMX Xeon, six on a Xeon with neither)
    own = groups["gpt2-bpe"]
    grafts = [made_mixed(d) for r, d in zip(own, groups["llama-char"], strict=True) if r.k == 0]
    assert len(grafts) >= 3, "gpt2-bpe should fail at least three of the prompts"
    counts = {}
    for split in ("rows", "groups"):
        for gate in ("closed", "open"):
            trainer = TorchTrainer(paths["gpt2-bpe"], minibatches=4, minibatch_split=split,
                                   **({"delta": 1e9} if gate == "closed" else {"gate": False}), **ARGS)
            result = trainer.train(prepared(trainer.score, batch_of(own, grafts)))
            counts[split, gate] = [(u.kind, u.rows) for u in result.minibatches]
    trained = (len(own) - len(grafts)) * own[0].n  # the own rows the grafts leave
    closed = counts["rows", "closed"]
    assert len(closed) == 4 and {kind for kind, _ in closed} == {"own"}
    assert sum(rows for _, rows in closed) == trained and max(r for _, r in closed) - min(r for _, r in closed) <= 1
    opened = counts["rows", "open"]
    assert len(opened) == 4 and max(r for _, r in opened) - min(r for _, r in opened) <= 1
    # the own rows first, the grafts' last: a run ending at or before the own rows' end is own, one
    # starting at or after it peer, one across it mixed (how many grafts there are, and so where the
    # seam falls, depends on the CPU's kernels)
    ends = np.cumsum([rows for _, rows in opened])
    expected = ["own" if end <= trained else "peer" if end - rows >= trained else "mixed"
                for end, (_, rows) in zip(ends, opened, strict=True)]
    assert [kind for kind, _ in opened] == expected and expected[-1] in ("mixed", "peer")
    # the groups split: 12 groups in 4 minibatches of 3, the grafts (last) leave theirs empty
    assert len(counts["groups", "closed"]) == 4 - len(grafts) // 3
    assert counts["groups", "open"][-1][0] == "peer"


def test_update_reports_the_own_and_peer_parts_of_its_gradient(paths, rollouts):
    """One minibatch with own and grafted rows: its own part is exactly the gradient of the own
    rows alone, rescaled to the mixed minibatch's token count (``minibatch`` normaliser)."""
    _, groups = rollouts
    own, grafts = groups["gpt2-bpe"], grafts_for("gpt2-bpe", "llama-char", groups)
    replaced = {g.prompt_id for g in grafts}
    # the own groups the grafts leave, each made mixed (a uniform one's first reward flipped): with
    # the sampled rewards alone they can all be uniform (advantage 0) on some CPUs, as they are on
    # an AMX Xeon, and the own part would be 0 = 0
    kept = [made_mixed(g) for g in own if g.prompt_id not in replaced]
    mixed = TorchTrainer(paths["gpt2-bpe"], minibatches=1, gate=False, grad_clip=1e9, **ARGS)
    update = mixed.train(batch_of(kept, grafts)).minibatches[0]
    alone = TorchTrainer(paths["gpt2-bpe"], minibatches=1, grad_clip=1e9, **ARGS)
    alone_update = alone.train(batch_of(kept)).minibatches[0]
    assert update.kind == "mixed" and alone_update.kind == "own"
    own_tokens = sum(len(t) for g in kept for t in g.token_ids)
    assert alone_update.grad_norm > 0
    assert update.own_grad_norm == pytest.approx(alone_update.grad_norm * own_tokens / update.tokens, rel=1e-4)
    assert update.peer_grad_norm > 0
    # the triangle inequality, up to float32 rounding of three norms of the same ~10^5 gradient
    # entries summed in different orders (a few ulp, relative)
    assert update.grad_norm <= (update.own_grad_norm + update.peer_grad_norm) * (1 + 1e-5)


def test_sgt_is_added_to_the_minibatch_of_its_prompts_own_group(paths, rollouts):
    """SGT (the spec): lambda x NLL of the peer's correct response joins the receiver's RL loss in
    the minibatch that holds the receiver's own group on that prompt; no update of its own."""
    problems, groups = rollouts
    own = groups["gpt2-bpe"]
    failed = [g for g in own if g.k == 0][:2]
    assert failed, "gpt2-bpe should fail some prompts"
    items = [(g.prompt, next(p.solution for p in problems if p.prompt_id == g.prompt_id), True, g.prompt_id)
             for g in failed]
    coef = 0.1
    trainer = TorchTrainer(paths["gpt2-bpe"], minibatches=1, sgt_coef=coef, **ARGS)
    nll = -np.asarray(trainer.score_peers(StepRecord({"prompt": [i[0] for i in items], "response": [i[1] for i in items],
                                                      "finished": [True] * len(items)}))["mean"])
    batch = batch_of(own, sgt=items)
    result = trainer.train(batch)
    assert [u.kind for u in result.minibatches] == ["mixed"]
    sgt_updates = [result.outcomes["update"][r] for r in batch.where(kind=SGT)]
    assert sgt_updates == [own_updates(batch, result)[g.prompt_id] for g in failed] == [0, 0]
    lengths = np.array([len(t) for g in own for t in g.token_ids], dtype=float)
    advantages = np.array([a for g in own for a in g.advantages], dtype=float)
    rl_loss = -(advantages * lengths).sum() / lengths.sum()  # rho = 1 on the first, on-policy update
    assert result.minibatches[0].loss == pytest.approx(rl_loss + coef * float(np.mean(nll)), rel=1e-4, abs=1e-6)


def test_a_misspelled_trainer_argument_is_an_error_that_names_it(paths):
    with pytest.raises(TypeError, match="peer_placment"):
        TorchTrainer(paths["gpt2-bpe"], peer_placment="spread")
