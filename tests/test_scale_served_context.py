"""``graftpool serve``'s vLLM engine takes the run's ``models[].generation.vllm.max_model_len``.

Without it the engine took the model's whole context (``max_position_embeddings``: 131,072 tokens
for Llama 3.2, 32,768 for Qwen2.5), and vLLM refuses to start an engine whose memory share cannot
hold the KV cache of one row that long: Llama-3.2-3B's is 14 GiB, more than a GPU shared by the
template's two models leaves it (0.45 of a 24 GB or 48 GB GPU less the weights), though the run
itself sampled within 5,120 tokens. Serve had no option to say otherwise, so the model could not be
served. Here on vLLM's CPU backend: a tiny Llama whose config names 262,144 positions (2 GiB of
fp32 KV cache a row, over the 1 GiB the engine is given) and a run folder with ``max_model_len:
256``; the server runs in a Ray worker as a Serve replica runs it (vLLM stays out of pytest)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.llama3_style import BOS, END_OF_TEXT, llama3_tokenizer
from tests.scale_setup import needs_vllm
from tests.served_run import served_run_folder

pytestmark = pytest.mark.slow


def build_long_context_llama(folder: Path) -> Path:
    """A tiny Llama of 262,144 positions and 8 KiB of fp32 KV cache a token (4 layers x 4 KV heads x 64)."""
    tokenizer = llama3_tokenizer(eos=END_OF_TEXT)
    ids = tokenizer.convert_tokens_to_ids
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, head_dim=64, max_position_embeddings=262_144,
                         bos_token_id=ids(BOS), eos_token_id=ids(END_OF_TEXT))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        LlamaForCausalLM(config).save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


@needs_vllm
def test_a_served_vllm_engine_takes_the_runs_max_model_len(ray_local, tmp_path):
    from orchestrator.serving.serve import ModelServer, run_model_loading

    run_dir = served_run_folder(tmp_path, "long", ["models.0.generation.backend=vllm",
                                                   "models.0.generation.vllm.max_model_len=256"])
    final = run_dir / "final" / "llama-char"
    shutil.rmtree(final)
    build_long_context_llama(final)
    loading = run_model_loading(run_dir)["llama-char"]  # what build_app binds the deployment with
    server = ray_local.remote(ModelServer.func_or_class).remote("llama-char", str(final), "auto", "vllm", 0.0,
                                                                **loading)
    try:
        assert "maximum context length is 256 tokens" in ray_local.get(server.length_for.remote(["1+2="], 256, True))
        [answer] = ray_local.get(server.complete.remote(["1+2="], 1, 0.0, 1.0, 4))
        assert answer["tokens"] and answer["prompt_tokens"] >= 1
    finally:
        ray_local.kill(server)
