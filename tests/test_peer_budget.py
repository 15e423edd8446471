"""A peer response whose row in the receiver's tokens is past ``trainer.max_tokens_per_micro_batch``
is neither scored nor trained (issue #51's tenth read).

The receiver's own rows are bounded by its generation (the GPU template: vLLM's ``max_model_len``
5,120, its token budget too); a peer's re-tokenisation is not. Llama 3's byte-level BPE writes up
to three digits a token and Qwen2.5's one, so a 4,096-token Llama-3.2 response can be up to 12,288
tokens in Qwen2.5-3B's, and its ZeRO-3 forward's whole-vocabulary logits grow with it (about 2.1 MB
a token: an update past about 8,000 tokens, or a scoring forward past about 12,000, holds more
than the L40S's 48 GB beside the rank's 30 GB of ZeRO-3 state; computed, docs/scale.md, the tenth read). Before,
such a row was scored and trained in a forward of its own, past the budget. The receiver here is
Llama-3.2-base-shaped (``tests.llama3_style``), on the real torch trainer; its forwards' padded
sizes are counted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from graftpool.step_record import StepRecord
from tests.llama3_style import build_llama32_base
from tests.tiny_pair import Group, batch_of
from workers.receiver.retokenize import response_end_id, retokenize
from workers.training.trainer import TorchTrainer

PROMPT = "What is 12+35? Output the final answer within \\boxed{}."
SHORT = "12+35=47 \\boxed{47}"
LONG = "12+35=" + "4" * 120 + " \\boxed{47}"  # a digit run: many more tokens than SHORT


@pytest.fixture(scope="module")
def llama32_base(tmp_path_factory) -> Path:
    return build_llama32_base(tmp_path_factory.mktemp("llama32-base"))


def budgeted(folder: Path, **changes) -> tuple[TorchTrainer, list[int]]:
    """A receiver whose budget holds SHORT's row and not LONG's (``changes``: other settings), and
    the padded size of each of its forwards (rows x longest row), as they run."""
    probe = TorchTrainer(folder, chat_template="auto", seed=0)
    prompt = len(probe._prompt_ids(PROMPT))
    short, long = (len(retokenize(probe.tokenizer, r, True, response_end_id(probe.tokenizer, "auto")))
                   for r in (SHORT, LONG))
    budget = prompt + short + 4
    assert prompt + long > budget + 20  # LONG's row is well past the budget
    trainer = TorchTrainer(folder, chat_template="auto", seed=0, lr=1e-3, max_tokens_per_micro_batch=budget,
                           **changes)
    sizes: list[int] = []
    forward = trainer._logprobs

    def counted(rows: StepRecord):
        sizes.append(len(rows) * max(len(p) + len(r) for p, r in zip(rows["prompt_ids"], rows["response_ids"],
                                                                      strict=True)))
        return forward(rows)

    trainer._logprobs = counted  # type: ignore[method-assign]
    return trainer, sizes


def test_a_grafted_response_past_the_token_budget_is_neither_scored_nor_trained(llama32_base):
    """The graft kind scores and trains SHORT and leaves LONG out: s NaN, w 0, not trained,
    ``gate/over_budget`` 1; no forward holds more than the budget (before: LONG's row was scored,
    and admitted, in forwards of its own past it)."""
    trainer, sizes = budgeted(llama32_base)
    donor = Group("donor", "p0", PROMPT, [SHORT, LONG], [], [], np.array([1.0, 0.0]),
                  advantages=np.array([1.0, -1.0]), mean_logp=np.array([-50.0, -50.0]), finished=[True, True])
    result = trainer.train(batch_of(grafts=[donor]))
    budget = trainer.settings.max_tokens_per_micro_batch
    assert sizes and max(sizes) <= budget, f"forwards of {sizes} padded tokens under a budget of {budget}"
    compat, weight, update = (result.outcomes[c] for c in ("compat", "weight", "update"))
    assert np.isfinite(compat[0]) and weight[0] > 0 and update[0] >= 0  # SHORT: scored, admitted, trained
    assert np.isnan(compat[1]) and weight[1] == 0.0 and update[1] == -1  # LONG: none of it
    assert result.metrics["gate/over_budget"] == 1.0
    assert result.metrics["gate/offered"] == 2.0 and result.metrics["gate/admitted"] == 1.0


def test_score_peers_answers_nan_for_a_row_past_the_token_budget(llama32_base):
    """The compatibility pass (``score_peers``) scores SHORT as before and answers NaN for LONG,
    whose forward holds one token of it (every rank still runs the same forwards)."""
    trainer, sizes = budgeted(llama32_base)
    rows = StepRecord({"prompt": [PROMPT] * 2, "response": [SHORT, LONG], "finished": [True, True]})
    got = trainer.score_peers(rows)
    budget = trainer.settings.max_tokens_per_micro_batch
    assert sizes and max(sizes) <= budget, f"forwards of {sizes} padded tokens under a budget of {budget}"
    plain = TorchTrainer(llama32_base, chat_template="auto", seed=0).score_peers(rows.select([0]))
    np.testing.assert_array_equal(got["logp"][0], plain["logp"][0])
    assert got["mean"][0] == plain["mean"][0]
    end = response_end_id(trainer.tokenizer, "auto")
    assert len(got["logp"][1]) == len(retokenize(trainer.tokenizer, LONG, True, end))
    assert np.all(np.isnan(got["logp"][1])) and np.isnan(got["mean"][1])


def test_an_sgt_item_past_the_token_budget_is_not_trained(llama32_base):
    """An SGT item whose row is past the budget is not trained (weight 0, no update), beside an own
    group that is (one update: pi_old is the update's own); no forward holds more than the budget."""
    trainer, sizes = budgeted(llama32_base, minibatches=1)
    own = Group("receiver", "p0", PROMPT, [SHORT, SHORT + " "], [], [], np.array([1.0, 0.0]),
                advantages=np.array([1.0, -1.0]), finished=[True, True])
    own.token_ids = [retokenize(trainer.tokenizer, r, True, trainer.end_id) for r in own.responses]
    result = trainer.train(batch_of(own=[own], sgt=[(PROMPT, LONG, True, "p0")]))
    budget = trainer.settings.max_tokens_per_micro_batch
    assert sizes and max(sizes) <= budget, f"forwards of {sizes} padded tokens under a budget of {budget}"
    assert result.outcomes["update"][:2] == [0, 0] and result.outcomes["update"][2] == -1
    assert result.outcomes["weight"][2] == 0.0 and result.metrics["gate/over_budget"] == 1.0


def test_an_added_peer_response_past_the_token_budget_is_not_trained(llama32_base):
    """HACPO's added peer rows: SHORT is trained, LONG is not (no update, weight 0); no forward holds
    more than the budget."""
    trainer, sizes = budgeted(llama32_base, minibatches=1)
    own = Group("receiver", "p0", PROMPT, [SHORT, SHORT + " "], [], [], np.array([1.0, 0.0]),
                advantages=np.array([1.0, -1.0]), finished=[True, True])
    own.token_ids = [retokenize(trainer.tokenizer, r, True, trainer.end_id) for r in own.responses]
    donor = Group("donor", "p0", PROMPT, [SHORT, LONG], [], [], np.array([1.0, 0.0]),
                  mean_logp=np.array([-1.0, -1.0]), finished=[True, True])
    result = trainer.train(batch_of(own=[own], peers=[(donor, [1.0, -1.0])]))
    budget = trainer.settings.max_tokens_per_micro_batch
    assert sizes and max(sizes) <= budget, f"forwards of {sizes} padded tokens under a budget of {budget}"
    assert result.outcomes["update"][2] == 0 and result.outcomes["update"][3] == -1
    assert result.outcomes["weight"][3] == 0.0 and result.metrics["gate/over_budget"] == 1.0
