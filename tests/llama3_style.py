"""A Llama-3-style model folder built here: a byte-level BPE tokenizer trained locally on the
synthetic tasks, with Llama 3's special tokens (BOS ``<|begin_of_text|>``, EOS ``<|eot_id|>``,
``<|end_of_text|>``, the header markers, a reserved ``<|finetune_right_pad_id|>``), a Llama-3
chat template and NO pad token, saved with a tiny random ``LlamaForCausalLM`` whose config names
no pad token either (as Meta's); and a Hugging Face cache laid out as the hub lays out a download.
Nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from graftpool.tasks import generate_problems

BOS, EOS, END_OF_TEXT, RESERVED_PAD = "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>", "<|finetune_right_pad_id|>"
SPECIALS = [BOS, END_OF_TEXT, RESERVED_PAD, "<|start_header_id|>", "<|end_header_id|>", EOS]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def llama3_tokenizer(specials: list[str] = SPECIALS, eos: str = EOS) -> PreTrainedTokenizerFast:
    """Byte-level BPE (vocabulary 400) trained on the tasks' prompts and solutions, ``specials``
    first (ids 0, 1, ...), ``eos`` its EOS; no pad token."""
    corpus = [f"{p.prompt} {p.solution}" for p in generate_problems(["add", "sub", "mod"], 300, seed=0, split="train")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=eos,
                                        chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False)
    assert tokenizer.pad_token is None
    return tokenizer


def build_llama3_style(folder: Path) -> Path:
    """The tokenizer and a tiny random Llama (1 layer, hidden 64) saved into ``folder``."""
    tokenizer = llama3_tokenizer()
    ids = tokenizer.convert_tokens_to_ids
    # one 64-wide head: vLLM's CPU attention takes no head_dim below 32
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                         bos_token_id=ids(BOS), eos_token_id=[ids(END_OF_TEXT), ids(EOS)], tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = [ids(END_OF_TEXT), ids(EOS)]
    model.generation_config.pad_token_id = None
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


TURN_END_FIRST = [EOS] + [t for t in SPECIALS if t != EOS]  # <|eot_id|> as id 0


def build_llama32_base(folder: Path, emits_turn_end: bool = False) -> Path:
    """A Llama-3.2-base-shaped folder: EOS ``<|end_of_text|>`` in the tokenizer and the generation
    config, a Llama 3 chat template closing turns with ``<|eot_id|>``, a tiny random Llama whose
    logits differ from token to token. ``emits_turn_end``: ``<|eot_id|>`` is id 0 and the final
    norm is zero, so every logit is 0 and greedy sampling emits ``<|eot_id|>`` first
    (``tests/test_turn_end.py``)."""
    tokenizer = llama3_tokenizer(TURN_END_FIRST if emits_turn_end else SPECIALS, eos=END_OF_TEXT)
    ids = tokenizer.convert_tokens_to_ids
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=1, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                         bos_token_id=ids(BOS), eos_token_id=ids(END_OF_TEXT), tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    if emits_turn_end:
        with torch.no_grad():
            model.model.norm.weight.zero_()  # every logit 0: greedy takes id 0, <|eot_id|>
    model.generation_config.eos_token_id = ids(END_OF_TEXT)
    model.generation_config.pad_token_id = None
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


def lay_out_hub_cache(folder: Path, hub_cache: Path, repo_id: str, commit: str = "0123456789abcdef" * 2 + "01234567") -> Path:
    """``folder``'s files in ``hub_cache`` (``$HF_HUB_CACHE``) exactly as ``huggingface_hub`` leaves a
    download: ``models--org--name/blobs/<sha256>`` holds each file, ``snapshots/<commit>/<file>`` is a
    relative link to its blob, and ``refs/main`` holds the commit hash. Returns the snapshot folder."""
    import hashlib
    import os

    repo = hub_cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)  # no newline, as the hub writes it
    for file in sorted(p for p in folder.iterdir() if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.write_bytes(file.read_bytes())
        os.symlink(os.path.relpath(blob, snapshot), snapshot / file.name)
    return snapshot
