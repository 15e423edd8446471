"""The trainer against an independent reference (``tests/reference.py``), on real samples of the
demo pair: the gate's s of every grafted response (Eq. 7: the receiver's pre-update weights on
its re-tokenisation minus the donor's generation log-probs), which responses are admitted, the
order of the own and peer updates (peer-last, peer-first), and the loss of each update (Eq. 10:
token mean over the admitted rows only, ratios against the RECEIVER's old log-probs, the second
update taken from weights the reference moved itself with AdamW)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from graftpool.contracts import GRAFT
from graftpool.tasks import generate_problems
from orchestrator.config import load_config
from orchestrator.models import resolve_model_path
from tests.reference import (
    RefRow,
    adamw_step,
    mean_logp,
    peer_tokens,
    prompt_tokens,
    token_logprobs,
    update_loss,
)
from tests.rollouts import sampled_groups
from tests.tiny_pair import batch_of, own_updates, per_group, prepared
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
RECEIVER, DONOR = "gpt2-bpe", "llama-char"
LR = 1e-3
K = 3  # grafted prompts, and as many own prompts the receiver keeps: minibatches=2 splits own | peer


@pytest.fixture(scope="module")
def setup():
    config = load_config(ROOT / "configs" / "demo_pair.yaml")
    paths = {m.name: resolve_model_path(m) for m in config.models}
    problems = generate_problems(["add", "sub", "mod", "digits"], 2 * K, seed=11, split="train")
    # rewards fixed by the test, so that the receiver fails the first K prompts outright and the
    # donor's groups there are mixed (Eq. 4); the receiver's other K groups are mixed
    receiver_rewards = np.array([[0, 0, 0, 0]] * K + [[1, 0, 1, 0]] * K, dtype=float)
    donor_rewards = np.array([[1, 0, 0, 1], [0, 1, 1, 1], [1, 0, 0, 0]] + [[1, 1, 0, 0]] * K, dtype=float)
    own = sampled_groups(RECEIVER, paths[RECEIVER], problems, receiver_rewards)
    donor = sampled_groups(DONOR, paths[DONOR], problems, donor_rewards)
    for group in donor:  # the source side of Eq. 7: the donor's generation log-probs
        group.mean_logp = np.array([np.mean(lp) for lp in group.gen_logprobs])
    grafts = donor[:K]

    model = AutoModelForCausalLM.from_pretrained(str(paths[RECEIVER]))
    tokenizer = AutoTokenizer.from_pretrained(str(paths[RECEIVER]))
    peers = []  # the reference's view of every grafted response
    for graft in grafts:
        q = prompt_tokens(tokenizer, graft.prompt)
        for text, done, adv, source in zip(graft.responses, graft.finished, graft.advantages, graft.mean_logp,
                                           strict=True):
            o = peer_tokens(tokenizer, text, done)
            receiver_mean = mean_logp(model, q, o)
            peers.append({"q": q, "o": o, "advantage": float(adv), "s": float(np.exp(receiver_mean - source))})
    own_rows = [{"q": prompt_tokens(tokenizer, g.prompt), "o": list(ids), "advantage": float(a)}
                for g in own[K:] for ids, a in zip(g.token_ids, g.advantages, strict=True)]
    s = np.array([p["s"] for p in peers])
    levels = np.unique(s)  # delta halfway between two distinct middle values of s: some responses
    delta = float(levels[len(levels) // 2 - 1:len(levels) // 2 + 1].mean())  # admitted, some dropped
    assert (s > delta).any() and (s <= delta).any()
    return {"paths": paths, "own": own, "grafts": grafts, "peers": peers, "own_rows": own_rows, "delta": delta}


def _reference(setup, peer_last: bool, gate: bool) -> tuple[list[str], list[float], np.ndarray]:
    """Kinds and losses of the two updates, and each peer's weight, by the reference."""
    model = AutoModelForCausalLM.from_pretrained(str(setup["paths"][RECEIVER]))
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), weight_decay=0.01)

    def old(q, o):  # pi_old^B: the receiver's weights before the step
        with torch.no_grad():
            return token_logprobs(model, q, o)

    s = np.array([p["s"] for p in setup["peers"]])
    weights = np.ones_like(s) if not gate else np.where(s > setup["delta"], np.minimum(s, 1.0), 0.0)
    own = [RefRow(r["q"], r["o"], r["advantage"], 1.0, old(r["q"], r["o"])) for r in setup["own_rows"]]
    peer = [RefRow(p["q"], p["o"], p["advantage"], float(w), old(p["q"], p["o"]))
            for p, w in zip(setup["peers"], weights, strict=True) if w > 0]
    order = [("own", own), ("peer", peer)] if peer_last else [("peer", peer), ("own", own)]
    losses = []
    for _, rows in order:
        loss = update_loss(model, rows)
        losses.append(float(loss.detach()))
        adamw_step(model, loss, optimizer, grad_clip=1.0)
    return [kind for kind, _ in order], losses, weights


@pytest.mark.parametrize(("peer_last", "gate"), [(True, True), (False, True), (True, False)],
                         ids=["peer-last", "peer-first", "no-gate"])
def test_trainer_matches_the_reference_gate_order_and_losses(setup, peer_last, gate):
    trainer = TorchTrainer(setup["paths"][RECEIVER], lr=LR, minibatches=2, minibatch_split="groups", seed=0,
                           delta=setup["delta"], peer_placement="last" if peer_last else "first", gate=gate)
    batch = prepared(trainer.score, batch_of(setup["own"], setup["grafts"]))
    result = trainer.train(batch)
    kinds, losses, weights = _reference(setup, peer_last, gate)

    s_ref = np.array([p["s"] for p in setup["peers"]])
    np.testing.assert_allclose(np.concatenate(per_group(batch, result, GRAFT, "compat")), s_ref, rtol=2e-4)
    np.testing.assert_allclose(np.concatenate(per_group(batch, result, GRAFT, "weight")), weights, rtol=2e-4)
    assert [u.kind for u in result.minibatches] == kinds
    # the first update is on-policy (rho = 1): its loss is exact; the second one's weights moved
    # by one AdamW step, which float noise can flip on near-zero gradients (|update| ~ lr)
    assert result.minibatches[0].loss == pytest.approx(losses[0], rel=1e-5, abs=1e-7)
    assert result.minibatches[1].loss == pytest.approx(losses[1], rel=1e-3, abs=1e-5)
    admitted = int((weights > 0).sum())
    assert [u.rows for u in result.minibatches] == (
        [len(setup["own_rows"]), admitted] if peer_last else [admitted, len(setup["own_rows"])])
    assert result.metrics["train/loss"] == pytest.approx(np.mean([u.loss for u in result.minibatches]), rel=1e-9)
    # each row reports the update that trained it
    expected_peer = 1 if peer_last else 0
    assert own_updates(batch, result) == {**{g.prompt_id: -1 for g in setup["own"][:K]},  # replaced
                                          **{g.prompt_id: 1 - expected_peer for g in setup["own"][K:]}}
    flat = np.concatenate(per_group(batch, result, GRAFT, "update"))
    assert (flat[weights > 0] == expected_peer).all() and (flat[weights == 0] == -1).all()
