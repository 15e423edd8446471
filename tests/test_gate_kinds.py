"""``exchange.gate_kind`` (workers/receiver/gate_kinds.py, issue #53): each kind's s against its
equation on hand-made numbers, the answer span found in real tokenizers' tokens, a receiver's
gate inputs read from a step record, and the kind checked at load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graftpool.step_record import StepRecord
from orchestrator.config import ConfigError, load_config
from workers.receiver.gate_kinds import GATE_KINDS, GateInputs, answer_start, gate_inputs
from workers.receiver.peer_transfer import PeerTransfer
from workers.receiver.retokenize import retokenize
from workers.zoo.model_zoo import build_tokenizer

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"
# two donor responses: l_B, l_A, n_B, n_A, bytes; reasoning means; the receiver's own group's means
HAND = GateInputs(receiver_mean=np.array([-1.0, -2.0]), donor_mean=np.array([-0.5, -1.5]),
                  receiver_tokens=np.array([10.0, 4.0]), donor_tokens=np.array([8.0, 5.0]),
                  text_bytes=np.array([20.0, 0.0]),
                  receiver_reasoning_mean=np.array([-0.8, np.nan]), donor_reasoning_mean=np.array([-0.6, -1.0]),
                  receiver_own_means=np.array([-1.2, -0.8, -1.0]))


def score(kind: str, g: GateInputs = HAND) -> np.ndarray:
    return GATE_KINDS.get(kind).score(g)


def test_each_gate_kind_is_its_equation_on_hand_numbers():
    # token_mean (Eq. 7): exp(l_B - l_A)
    np.testing.assert_allclose(score("token_mean"), np.exp([-0.5, -0.5]))
    # per_byte: exp((n_B l_B - n_A l_A) / bytes) = exp((-10 + 4) / 20); no text: NaN
    s = score("per_byte")
    assert s[0] == pytest.approx(np.exp(-0.3)) and np.isnan(s[1])
    # answer_masked: exp(r_B - r_A) = exp(-0.2); no reasoning token on the receiver's side: NaN
    s = score("answer_masked")
    assert s[0] == pytest.approx(np.exp(-0.2)) and np.isnan(s[1])
    # self_calibrated: exp(l_B - mean(own)) with mean(own) = -1.0
    np.testing.assert_allclose(score("self_calibrated"), np.exp([0.0, -1.0]))
    # no own response with a finite mean: no baseline
    empty = GateInputs(HAND.receiver_mean, HAND.donor_mean, receiver_own_means=np.array([]))
    assert np.isnan(score("self_calibrated", empty)).all()


def test_the_transfer_gates_on_its_kind_and_a_nan_s_admits_nothing():
    rewards, adv = np.array([1.0, 0.0]), np.array([0.7, -0.7])
    taken = PeerTransfer(gate_kind="self_calibrated").admit(HAND, rewards, adv, np.zeros(2))
    np.testing.assert_allclose(taken.s, np.exp([0.0, -1.0]))
    np.testing.assert_allclose(taken.w, [1.0, 0.0])  # s = 1 > 0.8; s = e^-1 < 0.8
    taken = PeerTransfer(gate_kind="per_byte", delta=0.5).admit(HAND, rewards, adv, np.zeros(2))
    np.testing.assert_allclose(taken.w, [np.exp(-0.3), 0.0])  # the empty text's NaN s: w = 0
    np.testing.assert_allclose(PeerTransfer().admit(HAND, rewards, adv, np.zeros(2)).s, np.exp([-0.5, -0.5]))
    with pytest.raises(ValueError, match=r"exchange.gate_kind: unknown gate kind 'nope'"):
        PeerTransfer(gate_kind="nope")


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_answer_start_counts_the_tokens_before_the_final_boxed(kind):
    text = "so 3 + 4 = \\boxed{6}? no: 3 + 4 = 7, \\boxed{7}"
    tok = build_tokenizer(kind, [text] * 4, vocab_size=120)
    ids = retokenize(tok, text, finished=True)
    k = answer_start(tok, ids, text)
    reasoning = tok.decode(ids[:k], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    at = text.rindex("\\boxed{")
    assert text.startswith(reasoning) and len(reasoning) <= at  # reasoning only...
    # ...and all of it: token k starts at or before the final \boxed{ and reaches past it
    assert len(tok.decode(ids[:k + 1], skip_special_tokens=False, clean_up_tokenization_spaces=False)) > at
    assert answer_start(tok, ids, "no answer at all") == len(ids)
    assert answer_start(tok, retokenize(tok, "\\boxed{1}", False), "\\boxed{1}") == 0


def test_a_receiver_reads_its_gate_inputs_from_the_step_record():
    """Two own rows and one graft row of a receiver's train record, the receiver's pi_old per
    token given: what each kind reads, from the record's columns and the tokens."""
    tok = build_tokenizer("char", [])
    text = "4 + 4 = \\boxed{8}"
    ids = retokenize(tok, text, finished=True)  # 17 characters + EOS
    receiver_logp = np.linspace(-2.0, -0.1, len(ids)).astype(np.float32)
    donor_logp = [-0.5] * 6 + [-3.0] * 4  # the donor's 10 tokens, 6 before its \boxed{
    step = StepRecord({
        "kind": ["own", "own", "graft"], "prompt_id": ["q", "q", "q"], "response": ["a", "b", text],
        "mean_logp": [-1.0, -2.0, -1.1], "token_ids": [[1], [2], list(range(10))],
        "old_logp": [None, None, np.asarray(donor_logp, dtype=np.float32)], "gen_logprobs": [[], [], donor_logp],
        "answer_start": [1, 1, 6]})
    g = gate_inputs("answer_masked", tok, step, [2], [receiver_logp], [ids])
    assert g.receiver_mean[0] == pytest.approx(receiver_logp.mean())
    assert (g.donor_mean[0], g.receiver_tokens[0], g.donor_tokens[0], g.text_bytes[0]) == (-1.1, 18, 10, 17)
    np.testing.assert_allclose(g.receiver_own_means, [-1.0, -2.0])
    assert g.receiver_reasoning_mean[0] == pytest.approx(receiver_logp[:8].mean())  # "4 + 4 = " is 8 characters
    assert g.donor_reasoning_mean[0] == pytest.approx(-0.5)
    assert gate_inputs("token_mean", tok, step, [2], [receiver_logp], [ids]).receiver_reasoning_mean is None


def test_the_gate_kind_is_checked_at_load():
    assert load_config(DEMO).exchange.gate_kind == "token_mean"
    assert load_config(DEMO, ["exchange.gate_kind=per_byte"]).exchange.gate_kind == "per_byte"
    with pytest.raises(ConfigError, match=r"exchange.gate_kind: expected one of \['answer_masked', 'per_byte', "
                                          r"'self_calibrated', 'token_mean'\] \(got 'per_token'\)"):
        load_config(DEMO, ["exchange.gate_kind=per_token"])
    stored = ["exchange.name=null", "exchange.routing={name: stored, store: /nowhere, peers: [a]}",
              "exchange.transfer=graft"]
    with pytest.raises(ConfigError, match=r"exchange.gate_kind: 'answer_masked' reads the donors' tokens"):
        load_config(DEMO, [*stored, "exchange.gate_kind=answer_masked"])


def _step_one(rows: list[dict]) -> tuple[dict, dict, dict]:
    """Step 1 of a store: graft rows by (receiver, prompt, sample, donor); own rows' n_tokens by
    (model, prompt, sample); each model's own mean_logp by prompt."""
    grafts = {(r["model"], r["prompt_id"], r["sample"], r["source_model"]): r
              for r in rows if r["step"] == 1 and r["kind"] == "graft"}
    own = [r for r in rows if r["step"] == 1 and r["kind"] == "own"]
    lengths = {(r["model"], r["prompt_id"], r["sample"]): r["n_tokens"] for r in own}
    means: dict[tuple, list[float]] = {}
    for r in own:
        means.setdefault((r["model"], r["prompt_id"]), []).append(r["mean_logp"])
    return grafts, lengths, means


@pytest.mark.slow
def test_each_gate_kind_trains_the_demo_pair_and_stores_its_s(tmp_path, ray_local, graft_pair_run):
    """The demo pair, 2 steps, graft, once per gate kind (same seed). Step 1's rollouts and
    pre-update weights are the same in every run, so the default run's store gives l_B = ln s + l_A
    of each graft row; each other run's ``compat`` is its kind's equation on those and the store's
    columns, and its ``weight`` is Eq. 8 on that s. The default (token_mean) run is the session's
    ``graft_pair_run`` (the same settings, ``tests/shared_runs.py``)."""
    from orchestrator.controller.loop import train
    from tests.platform_checks import read_store
    from tests.shared_runs import SHORT_PAIR

    kinds = ("token_mean", "per_byte", "self_calibrated", "answer_masked")
    assert load_config(graft_pair_run / "config.yaml").exchange.gate_kind == kinds[0]
    for kind in kinds[1:]:
        train(load_config(DEMO, [*SHORT_PAIR, f"run.output_dir={tmp_path}", f"exchange.gate_kind={kind}",
                                 f"run.name={kind}"]))
    stores = {kind: read_store(tmp_path / kind) for kind in kinds[1:]}
    stores[kinds[0]] = read_store(graft_pair_run)
    base, lengths, own_means = _step_one(stores["token_mean"])
    assert len(base) >= 8, "too few graft rows at step 1 to check the kinds on"
    for kind in kinds[1:]:
        grafts, _, _ = _step_one(stores[kind])
        assert grafts.keys() == base.keys()
        for key, b in base.items():
            r, l_a = grafts[key], b["mean_logp"]
            l_b = np.log(b["compat"]) + l_a
            if kind == "per_byte":
                n_a = lengths[(b["source_model"], b["prompt_id"], b["sample"])]
                want = np.exp((b["n_tokens"] * l_b - n_a * l_a) / len(b["response"].encode("utf-8")))
            elif kind == "self_calibrated":
                want = np.exp(l_b - np.mean(own_means[(b["model"], b["prompt_id"])]))
            elif "\\boxed{" not in b["response"]:  # answer_masked with no answer span: the whole response
                want = b["compat"]
            else:
                continue
            assert r["compat"] == pytest.approx(want, rel=1e-5, abs=1e-12, nan_ok=True), (kind, key)
        s = np.array([r["compat"] for r in stores[kind] if r["kind"] == "graft"], dtype=float)
        w = np.array([r["weight"] for r in stores[kind] if r["kind"] == "graft"], dtype=float)
        np.testing.assert_allclose(w, np.where(s > 0.8, np.minimum(s, 1.0), 0.0))
    # the answer span changes s wherever there is one
    boxed = [key for key, b in base.items() if "\\boxed{" in b["response"]]
    assert boxed and any(_step_one(stores["answer_masked"])[0][key]["compat"] != pytest.approx(base[key]["compat"])
                         for key in boxed)
