"""What a receiver reports of the SGT items it is routed (issue #51's thirty-sixth read): an SGT row's
``n_tokens`` is its length in the receiver's tokens (``graftpool.step_record.OUTCOMES``), as a
grafted or an added peer row's is, not the donor's token count that the row carries in
``token_ids``; and every SGT string the receiver re-tokenises counts in ``gate/lossy_retokenized``
(docs/metrics.md: "the peer strings the model re-tokenised"), as a grafted or peer string does.

The receiver is the demo's llama-char (a character vocabulary, so ``√`` becomes ``<unk>``) on the
real torch trainer; the donor's ``token_ids`` stand for another tokenizer's (the GPU template's
Qwen2.5-3B and Llama-3.2-3B write a response in different numbers of tokens)."""

from __future__ import annotations

from graftpool.contracts import SGT
from tests.tiny_pair import batch_of
from workers.receiver.retokenize import retokenize
from workers.training.trainer import TorchTrainer

PROMPT = "12+35="
SPELLED = "12+35=47"
UNSPELLED = "x = √47"  # no '√' in the char vocabulary: <unk>, a lossy re-tokenisation


def test_sgt_rows_report_the_receivers_token_count_and_count_lossy_strings(paths):
    trainer = TorchTrainer(paths["llama-char"], seed=0, lr=1e-3)
    batch = batch_of(sgt=[(PROMPT, SPELLED, True, "p0"), (PROMPT, UNSPELLED, True, "p1")])
    donor_ids = [[7, 8, 9], [7, 8]]  # the donor's tokens: fewer than the receiver's characters
    batch = batch.with_columns(token_ids=[donor_ids[i] for i in range(len(batch))])
    result = trainer.train(batch)
    rows = batch.where(kind=SGT)
    want = [len(retokenize(trainer.tokenizer, batch["response"][r], True, trainer.end_id)) for r in rows]
    assert want[0] != len(donor_ids[0])
    assert [result.outcomes["n_tokens"][r] for r in rows] == want
    assert all(result.outcomes["update"][r] >= 0 for r in rows)  # both trained
    assert result.metrics["gate/lossy_retokenized"] == 0.5
