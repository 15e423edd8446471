"""``make rehearsal``'s recorded bytes per weight sync are what a sync sends.

Both trainers hand the sync their module's state dict (``workers.rollout.weight_sync.make_plan``),
where a tied LM head is a name of its own beside the embedding; the exported ``final/<model>``
folder holds the tied tensor once. ``benchmarks.rehearsal.sync_bytes`` counted the folder's
tensors, so ``rehearsal.json`` recorded 269,030,016 bytes a SmolLM2 sync where the sync sends
325,653,120 (issue #51's forty-second read, half b). A real tiny tied Llama, saved as a run's
final model.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.rehearsal import sync_bytes
from workers.rollout.weight_sync import make_plan


def test_a_tied_heads_sync_bytes_count_it_as_the_sync_sends_it(tmp_path):
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.save_pretrained(tmp_path / "final" / "tied")
    sent = make_plan({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}).nbytes
    assert "lm_head.weight" in model.state_dict(), "the tied head is a name of the state dict the sync plans"
    assert sync_bytes(tmp_path / "final") == {"tied": sent}, "the bytes one bf16 sync of the model sends"
