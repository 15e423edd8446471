"""What operations.md tells a user whose trainer ran out of GPU memory, against the packing rule.

Issue #51's twentieth read: operations.md advised lowering ``trainer.max_tokens_per_micro_batch``
and ``--resume`` after a trainer's CUDA out-of-memory error. A row longer than the budget runs
alone at its own length (``pack_by_tokens``), and the resumed step replays the same responses, so
with the GPU template's budget at its longest row (5,120 = ``vllm.max_model_len``) a lower budget
leaves the forward that ran out as large as it was: the advice led to the same error after the
resume. The docs now say where the budget stops bounding a forward. The twenty-first read: only on a
step with a full-length row; a step whose longest row is shorter (prompt + 4,096 on the template)
packs shorter rows up to 5,120 into one forward, and a budget at its longest row makes the largest
forward smaller, so the docs say a lower budget helps down to that row and no further."""

from __future__ import annotations

from pathlib import Path

import yaml

from workers.training.logprobs import pack_by_tokens

ROOT = Path(__file__).resolve().parent.parent


def test_a_budget_below_the_longest_row_leaves_its_forward_whole_and_the_docs_say_so():
    template = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())
    for model in template["models"]:
        longest = model["generation"]["vllm"]["max_model_len"]
        assert model["trainer"]["max_tokens_per_micro_batch"] == longest
        lengths = [longest, 1000, 1000, 800]  # the step that ran out: one full-length row
        for budget in (longest, longest // 2, 512):
            padded = max(-(-len(mb) // 2) * max(lengths[i] for i in mb) for mb in pack_by_tokens(lengths, budget, 2))
            assert padded == longest  # a lower budget: the same largest forward, one rank's row of 5,120 tokens
        lengths = [longest - 724, 2550, 2550, 2550, 2550]  # a 300-token prompt + 4,096: the longest row
        largest = {budget: max(-(-len(mb) // 2) * max(lengths[i] for i in mb)
                               for mb in pack_by_tokens(lengths, budget, 2)) for budget in (longest, lengths[0])}
        assert largest[lengths[0]] < largest[longest]  # here a budget at the longest row does help
    advice = (ROOT / "docs" / "operations.md").read_text()
    advice = " ".join(advice[advice.index("an error inside an actor that leaves it alive"):].split())
    assert "a row longer than `max_tokens_per_micro_batch` runs alone at its own length" in advice, \
        "operations.md's out-of-memory advice does not say a lower token budget leaves a longer row's forward whole"
    assert "a lower budget helps down to the failed step's longest row" in advice, \
        "operations.md's out-of-memory advice does not say down to which row a lower budget helps"
