"""A finished peer response ends, in the receiver's tokens, as the receiver's own responses end.

Under ``models[].chat_template: auto`` a base model's own responses end at the token its chat
template closes an assistant turn with (Llama 3's ``<|eot_id|>``, ChatML's ``<|im_end|>``), not
at its tokenizer's EOS (``<|end_of_text|>``, ``<|endoftext|>``): ``workers.rollout.chat``. A
grafted, added or SGT peer response that its donor finished is re-tokenised by the receiver with
that same end (``workers.receiver.retokenize.response_end_id``), so the gate's receiver side
scores, and the update trains, the end the receiver itself writes. The receiver here is
Llama-3.2-base-shaped (EOS ``<|end_of_text|>``, a Llama 3 chat template), its tokenizer trained
here, its tiny model random, on the real torch trainer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from graftpool.step_record import StepRecord
from tests.llama3_style import END_OF_TEXT, EOS, build_llama32_base, llama3_tokenizer
from tests.tiny_pair import Group, batch_of
from workers.receiver.retokenize import response_end_id, retokenize, token_rows
from workers.training.trainer import TorchTrainer

PROMPT = "What is 12+35? Output the final answer within \\boxed{}."
RESPONSES = ["12+35=47 \\boxed{47}", "12+35=46 \\boxed{46}"]


@pytest.fixture(scope="module")
def llama32_base(tmp_path_factory) -> Path:
    return build_llama32_base(tmp_path_factory.mktemp("llama32-base"))


def test_the_receivers_end_is_its_turn_end_under_its_chat_template_else_its_eos(llama32_base):
    tokenizer = llama3_tokenizer(eos=END_OF_TEXT)
    eot, end = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    assert response_end_id(tokenizer, "auto") == eot
    assert response_end_id(tokenizer, "none") == end
    assert retokenize(tokenizer, RESPONSES[0], True, eot)[-1] == eot
    assert retokenize(tokenizer, RESPONSES[0], False, eot)[-1] not in (eot, end)


def _with_end(trainer: TorchTrainer, end: int) -> list[torch.Tensor]:
    """The receiver's log-probs of RESPONSES, each re-tokenised and closed with ``end``."""
    ids = trainer._prompt_ids(PROMPT)
    return trainer.score_rows(token_rows([ids] * len(RESPONSES),
                                         [retokenize(trainer.tokenizer, r, True, end) for r in RESPONSES]))


def test_a_finished_peer_response_is_scored_with_the_receivers_turn_end(llama32_base):
    """``score_peers`` (the gate's receiver side, pi_old of a routed response) scores a finished
    peer response closed by ``<|eot_id|>``, as the receiver's own chat turns close; before, by
    its EOS ``<|end_of_text|>``, a token its template never writes there."""
    trainer = TorchTrainer(llama32_base, chat_template="auto", seed=0)
    eot, end = (trainer.tokenizer.convert_tokens_to_ids(t) for t in (EOS, END_OF_TEXT))
    rows = StepRecord({"prompt": [PROMPT] * 2, "response": RESPONSES, "finished": [True, True]})
    got = trainer.score_peers(rows)["logp"]
    expected, eos_ended = _with_end(trainer, eot), _with_end(trainer, end)
    assert not np.isclose(float(expected[0][-1]), float(eos_ended[0][-1]))  # the two ends differ here
    for logp, want in zip(got, expected, strict=True):
        np.testing.assert_array_equal(logp, want.numpy())


def test_a_graft_is_gated_and_trained_on_the_receivers_turn_end(llama32_base):
    """The graft kind's own scoring of a finished donor response (no ``receiver_logp`` from a
    compatibility pass) ends it as ``score_peers`` does: its gate score s equals the one given the
    log-probs of the response closed by ``<|eot_id|>``."""
    donor = Group("donor", "p0", PROMPT, RESPONSES, [], [], np.array([1.0, 0.0]), advantages=np.array([1.0, -1.0]),
                  mean_logp=np.array([-0.5, -0.7]), finished=[True, True])
    batch = batch_of(grafts=[donor])
    scored = TorchTrainer(llama32_base, chat_template="auto", seed=0)
    eot = scored.tokenizer.convert_tokens_to_ids(EOS)
    given = batch.with_columns(receiver_logp=[lp.numpy() for lp in _with_end(scored, eot)])
    expected = scored.train(given).outcomes["compat"]
    got = TorchTrainer(llama32_base, chat_template="auto", seed=0).train(batch).outcomes["compat"]
    assert np.all(np.isfinite(expected))
    np.testing.assert_allclose(got, expected, rtol=1e-6)
