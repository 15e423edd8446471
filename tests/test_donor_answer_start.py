"""A donor's answer start (``TorchTrainer.answer_starts``, the record's ``answer_start``) counts the
tokens before the final ``\\boxed{`` of its response's text as the replicas decode that text:
without special tokens (``workers/rollout/vllm_generation.py``, ``generation.py``). A special token
the model wrote before its answer (a base model's ``<|start_header_id|>``, ``<|im_start|>``) is in
``token_ids`` but not in ``response``; decoded with its name, every prefix after it was that many
characters longer than the text it is compared with, and the start came tokens early. The
receiver here is Llama-3.2-base-shaped, its tokenizer trained here, on the real torch trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from graftpool.step_record import StepRecord
from tests.llama3_style import build_llama32_base
from workers.training.trainer import TorchTrainer

REASONING, ANSWER = "12+35 is 47, so the answer is ", "\\boxed{47}"


@pytest.fixture(scope="module")
def llama32_base(tmp_path_factory) -> Path:
    return build_llama32_base(tmp_path_factory.mktemp("llama32-base"))


def test_a_donors_answer_start_counts_a_special_token_it_wrote_before_its_answer(llama32_base):
    trainer = TorchTrainer(llama32_base, chat_template="auto", seed=0)
    tok = trainer.tokenizer
    header, eot = tok.convert_tokens_to_ids("<|start_header_id|>"), tok.convert_tokens_to_ids("<|eot_id|>")
    before = tok(REASONING, add_special_tokens=False)["input_ids"]
    answer = tok(ANSWER, add_special_tokens=False)["input_ids"]
    ids = [*before[:3], header, *before[3:], *answer, eot]  # a finished response, a special token inside
    text = tok.decode(ids, skip_special_tokens=True)  # as the replicas write `response`
    assert text == REASONING + ANSWER
    start = trainer.answer_starts(StepRecord({"token_ids": [ids], "response": [text]}))[0]
    assert start == len(before) + 1, (  # the reasoning's tokens and the special one among them
        f"answer_start {start} of {len(ids)} tokens: {tok.convert_ids_to_tokens(ids[start:start + 3])} begin the "
        f"answer, not {tok.convert_ids_to_tokens(answer[:3])}")
    # no special token: as before
    plain = [*before, *answer, eot]
    assert trainer.answer_starts(StepRecord({"token_ids": [plain], "response": [text]}))[0] == len(before)
