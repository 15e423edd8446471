"""A model's tokenizer as every actor loads it (generation replicas, trainer ranks, the driver's
checks): left-padded, with a pad token even where the model's files name none."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerFast

from workers.hub import model_folder

GENERIC_TOKENIZER_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}
"""Classes that mean "the folder's tokenizer.json, as saved" (what the zoo writes)."""


PADDED_WITH_EOS: set[str] = set()
"""Folders whose tokenizer this process has already said it pads with EOS (said once each)."""


def load_tokenizer(path: str | Path, trust_remote_code: bool = False, pad_token: str | None = None):
    """The tokenizer of a model folder or hub id (``workers.hub.model_folder``), left-padded.

    Its pad token is ``pad_token`` (``models[].pad_token``, a token of its vocabulary) when given,
    else its own, else its EOS token (as TRL and verl do: Llama-3's tokenizers have none), said once
    per folder and process. Padding never marks where a response ends (the trainer's masks come from
    the rows' lengths, generation stops at the stop ids), so an EOS that is also the pad token stays
    a trained token. Refuses a tokenizer without an EOS token.

    A folder whose tokenizer_config.json declares a generic class loads its tokenizer.json
    exactly as saved. AutoTokenizer would not: transformers 5 forces some model types'
    own class (qwen2 -> Qwen2Tokenizer, which rebuilds a byte-level pre-tokenizer), and
    for a zoo qwen2 model with a char vocabulary that silently dropped every space.
    """
    folder = model_folder(path)
    config_file = folder / "tokenizer_config.json"
    declared = json.loads(config_file.read_text()).get("tokenizer_class") if config_file.is_file() else None
    if declared in GENERIC_TOKENIZER_CLASSES:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder))
    else:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    if tokenizer.eos_token_id is None:
        raise ValueError(f"models[].path {path}: the tokenizer has no EOS token")
    if pad_token is not None:
        if pad_token not in tokenizer.get_vocab():
            raise ValueError(f"models[].pad_token {pad_token!r} is not a token of the tokenizer of {path}; "
                             f"give one of its tokens (its EOS is {tokenizer.eos_token!r}) or leave it unset")
        tokenizer.pad_token = pad_token
    elif tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        if str(folder) not in PADDED_WITH_EOS:
            PADDED_WITH_EOS.add(str(folder))
            warnings.warn(f"models[].path {path}: the tokenizer has no pad token; padding with its EOS token "
                          f"{tokenizer.eos_token!r} (models[].pad_token sets another)", stacklevel=2)
    tokenizer.padding_side = "left"
    return tokenizer
