"""Tiny heterogeneous model zoo: causal LMs built from configs, tokenizers trained locally.

GRAFT exchanges trajectories between models that differ in architecture *and*
tokenizer, so the zoo mixes llama/gpt2/qwen2 with char and BPE tokenizers. Nothing is
downloaded: configs are written in code, tokenizers are trained with ``tokenizers`` on
the task texts, and each model is warm-started on an SFT mix that over-weights some
tasks, which makes the models' skills partial and complementary. Built models are
cached on disk under a hash of their spec (written to a temp folder, then renamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import string
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from graftpool.cache_lock import build_once
from graftpool.tasks import TASKS, Problem, generate_problems
from workers.rollout.tokenizer import load_tokenizer
from workers.zoo.warmstart import group_outcomes, success_counts, task_success, warm_start
from workers.zoo.zoo_spec import Arch, ModelSpec, TokenizerKind

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
"""Fixed order, so pad=0, bos=1, eos=2, unk=3 in every zoo tokenizer."""
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
BASE_CHARS = [c for c in string.printable if c not in "\t\r\x0b\x0c"]
"""Printable ASCII: covers every character the task family (and most datasets) emit."""
ZOO_VERSION = 2
"""Bump when building changes in a way the spec does not capture (invalidates caches)."""
_BPE_SPLIT = Regex(r" ?[A-Za-z]+|\d| ?[^\sA-Za-z\d]+|\s+")
"""GPT-2-like pre-split: words, single digits, punctuation runs (digits stay one token)."""


def build_tokenizer(
    kind: TokenizerKind, corpus: Sequence[str], vocab_size: int = 256
) -> PreTrainedTokenizerFast:
    """A char-level or BPE tokenizer with pad != eos, left padding, no auto specials.

    ``char`` maps each printable ASCII character (plus any other character in
    ``corpus``) to one id; ``bpe`` trains merges on ``corpus`` up to ``vocab_size``.
    Encoding adds no special tokens, and decode(encode(text)) == text for covered text.
    """
    if kind == "char":
        extra = sorted({c for text in corpus for c in text} - set(BASE_CHARS))
        vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + BASE_CHARS + extra)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.Split(_BPE_SPLIT, behavior="isolated")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=BASE_CHARS,
            show_progress=False,
        )
        tok.train_from_iterator(list(corpus), trainer)
    else:
        raise ValueError(f"unknown tokenizer kind {kind!r}; use 'char' or 'bpe'")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert [tok.token_to_id(t) for t in (PAD, BOS, EOS)] == [PAD_ID, BOS_ID, EOS_ID]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def _config(
    arch: Arch, vocab_size: int, hidden: int, layers: int, heads: int, max_positions: int
) -> PretrainedConfig:
    ids = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}
    if arch == "gpt2":
        # Dropout off: RL needs the same logprobs at rollout and at training time.
        return GPT2Config(
            vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads,
            n_positions=max_positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **ids,
        )  # fmt: skip
    common = {
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 3 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": heads,
        "max_position_embeddings": max_positions, "tie_word_embeddings": True, **ids,
    }  # fmt: skip
    if arch == "llama":
        return LlamaConfig(num_key_value_heads=heads, **common)
    if arch == "qwen2":
        # Grouped-query attention, unlike the llama member, for architectural variety.
        return Qwen2Config(num_key_value_heads=max(1, heads // 2), **common)
    raise ValueError(f"unknown arch {arch!r}; use 'llama', 'gpt2' or 'qwen2'")


def build_model(
    arch: Arch,
    vocab_size: int,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_positions: int = 128,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised tiny causal LM, deterministic in ``seed``.

    pad/bos/eos ids are the zoo tokenizers' fixed ids (0/1/2). The global torch RNG is
    left untouched.
    """
    if hidden_size % num_heads or hidden_size // num_heads < 16:
        raise ValueError(
            f"hidden_size {hidden_size} / num_heads {num_heads} must give head_dim >= 16"
        )
    config = _config(arch, vocab_size, hidden_size, num_layers, num_heads, max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.loss_type = "ForCausalLM"  # GPT2LMHeadModel's name maps to no loss type (warns)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    return model.eval()


def _focus(strong: Sequence[str], strong_weight: float, weak_weight: float) -> dict[str, float]:
    return {t: strong_weight if t in strong else weak_weight for t in TASKS}


def default_zoo_specs() -> list[ModelSpec]:
    """Three models differing in arch and tokenizer, each strong on two other tasks.

    Each SFT mix weighs two focus tasks 0.4 and the other four 0.025 (about 44% and 3%
    of the data), so a model has mostly mixed groups on its focus tasks and mostly
    all-fail groups on the others' hard focus tasks: there, only a peer's
    trajectories carry reward.
    """
    members = [
        ("llama-char", "llama", "char", ["add", "mod"]),
        ("gpt2-bpe", "gpt2", "bpe", ["sub", "digits"]),
        ("qwen2-char", "qwen2", "char", ["linear", "count"]),
    ]
    return [
        ModelSpec(name=n, arch=a, tokenizer=t, seed=i + 1, sft_tasks=_focus(f, 0.4, 0.025))
        for i, (n, a, t, f) in enumerate(members)
    ]


def _cache_key(spec: ModelSpec, problems: Sequence[Problem]) -> str:
    # styles, slips and reasoning-gym settings are in the hashed problems below; leaving them out
    # keeps earlier caches valid
    fields = spec.model_dump_json(exclude={"solution_style", "sft_slips", "slip", "style_mix",
                                                "sft_datasets"})
    h = hashlib.sha256(f"zoo-v{ZOO_VERSION}\n{fields}".encode())
    for p in problems:
        h.update(f"\n{p.prompt}\x00{p.solution}".encode())
    return h.hexdigest()[:16]


MARKER = "zoo.json"
"""Written last inside a built folder; its presence means the folder is complete."""


def zoo_folder(spec: ModelSpec, problems: Sequence[Problem] | None = None,
               cache_dir: str | Path = ".cache/zoo") -> Path:
    """The cache folder of ``spec``'s build (complete when it holds :data:`MARKER`)."""
    problems = list(problems) if problems is not None else spec.sft_data()
    return Path(cache_dir) / f"{spec.name}-{_cache_key(spec, problems)}"


def build_zoo_model(
    spec: ModelSpec,
    problems: Sequence[Problem] | None = None,
    cache_dir: str | Path = ".cache/zoo",
) -> Path:
    """Build (tokenizer, model, warm start) and save to a cached folder; return its path.

    ``problems`` default to ``spec.sft_data()``; they are both the BPE corpus and the
    SFT set, and part of the cache key. A complete folder is reused as is; a new one is
    built in a temp folder and renamed into place, so a crash leaves no half cache; one
    process builds it at a time (:func:`graftpool.cache_lock.build_once`).
    """
    problems = list(problems) if problems is not None else spec.sft_data()
    final = zoo_folder(spec, problems, cache_dir)
    return build_once(final, MARKER, lambda: _build_into(final, spec, problems))


def _build_into(final: Path, spec: ModelSpec, problems: list[Problem]) -> Path:
    start = time.perf_counter()
    corpus = [text for p in problems for text in (p.prompt, p.solution)]
    tokenizer = build_tokenizer(spec.tokenizer, corpus, spec.vocab_size)
    model = build_model(
        spec.arch, len(tokenizer), spec.hidden_size, spec.num_layers, spec.num_heads,
        spec.max_positions, spec.seed,
    )  # fmt: skip
    metrics = {}
    if spec.sft_steps > 0:
        # on the GPU when there is one (a GPU's build rounds differently: the cache is per machine)
        metrics = warm_start(
            model, tokenizer, problems, spec.sft_steps, spec.sft_lr, spec.sft_batch_size, spec.seed,
            device="cuda" if torch.cuda.is_available() else "cpu",
        )
    info = {"spec": spec.model_dump(), "warm_start": metrics, "build_seconds": time.perf_counter() - start}
    return save_model_folder(final, model, tokenizer, info)


def save_model_folder(final: Path, model, tokenizer, info: dict, marker: str = MARKER) -> Path:
    """Save model + tokenizer + ``info`` (as ``marker``, written last) into a temp folder
    beside ``final``, then rename it into place: a crash leaves no half folder, and a folder
    with its marker is complete. A concurrent build that won the rename is kept."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / marker).write_text(json.dumps(info, indent=2))
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).is_file():  # a stale incomplete folder: replace it
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def zoo_report(
    specs: Sequence[ModelSpec],
    problems: Sequence[Problem],
    n: int = 8,
    temperature: float = 1.0,
    max_new_tokens: int = 32,
    seed: int = 0,
    cache_dir: str | Path = ".cache/zoo",
) -> dict:
    """Build/load each model and measure its GRPO group outcomes and complementarity.

    For each model: all-fail / mixed / all-pass shares of ``n``-sample groups and its
    build time. For each ordered pair (a, b): prompts where a is all-fail while b has a
    mixed group, i.e. where only a peer's trajectories can give a a learning signal.
    """
    counts: dict[str, list[int]] = {}
    report: dict = {"models": {}, "pairs": {}, "prompts": len(problems), "n": n}
    for spec in specs:
        start = time.perf_counter()
        path = build_zoo_model(spec, cache_dir=cache_dir)
        info = json.loads((path / MARKER).read_text())
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = load_tokenizer(path)
        counts[spec.name] = success_counts(
            model, tokenizer, problems, n, temperature, max_new_tokens, seed
        )
        report["models"][spec.name] = {
            **group_outcomes(counts[spec.name], n),
            "build_seconds": info["build_seconds"],
            "load_or_build_seconds": time.perf_counter() - start,
            "task_success": task_success(counts[spec.name], problems, n),
        }
    for a in counts:
        for b in counts:
            if a != b:
                report["pairs"][f"{a}->{b}"] = sum(
                    ca == 0 and 0 < cb < n for ca, cb in zip(counts[a], counts[b], strict=True)
                )
    return report


def main() -> None:
    """Print the default zoo's skill report: ``python -m workers.zoo.model_zoo [num_prompts]``."""
    import sys

    torch.set_num_threads(1)
    problems = generate_problems(
        list(TASKS), int(sys.argv[1]) if len(sys.argv) > 1 else 64, seed=123, split="eval"
    )
    print(json.dumps(zoo_report(default_zoo_specs(), problems), indent=2))


if __name__ == "__main__":
    main()
