"""reasoning-gym as a task source: problems drawn from its procedural generators.

reasoning-gym (the optional ``[reasoning-gym]`` extra) has about a hundred seeded generators
(arithmetic, algebra, logic, graphs, games, ...), each with its own answer scorer,
``score_answer(answer, entry)``. Nothing is downloaded: every generator runs in code, from word
lists shipped inside the package. A source names datasets and their generator settings,
``{"basic_arithmetic": {"max_terms": 2}, "spell_backward": {}}``; problems are drawn from a
uniform (or weighted) mix of them, seeded, each one's task being its dataset's name.

Train and eval sets are disjoint the way the synthetic tasks' are: every question falls on one
side of the fixed hash partition (:func:`graftpool.tasks.prompt_split`), and a train draw keeps
only train-side questions, an eval draw only eval-side ones; so no seed or size can make them
overlap. A problem's ``metadata`` carries what its scorer needs in a verifier actor
(:data:`DATASET_KEY`, :data:`SETTINGS_KEY`, :data:`ENTRY_KEY`; ``workers.verify.rg_verifier``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from graftpool.tasks import INSTRUCTION, Problem, Split, boxed, make_problem, prompt_split

EXTRA = "reasoning-gym"
"""The pyproject extra that installs reasoning-gym (``make install`` does)."""

DATASET_KEY, SETTINGS_KEY, ENTRY_KEY = "rg_dataset", "rg_settings", "rg_entry"
"""Keys of a problem's metadata: dataset name, its generator settings, the generated entry."""

Settings = Mapping[str, Any]


def _expression(entry: Mapping[str, Any]) -> str:
    return f"{entry['metadata']['expression']} = {entry['answer']}, {boxed(str(entry['answer']))}"


WORKED: dict[str, Callable[[Mapping[str, Any]], str]] = {"basic_arithmetic": _expression, "chain_sum": _expression}
"""Warm-start solutions for datasets whose entry lets one write the work out (the synthetic
tasks' worked form, ``12 + 35 = 47, \\boxed{47}``: tiny models learn arithmetic from it, hardly
from the bare answer); every other dataset's solution is its boxed answer."""


def require() -> ModuleType:
    """The ``reasoning_gym`` module, or ImportError saying how to install it."""
    try:
        import reasoning_gym
    except ImportError as exc:
        raise ImportError(f"reasoning-gym is not installed ({exc}); install the [{EXTRA}] extra: "
                          f"pip install -e '.[{EXTRA}]' (make install does)") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    """Every dataset reasoning-gym registers."""
    return sorted(require().factory.DATASETS)


def _stream_seed(seed: int | str, name: str) -> int:
    """One generator seed per (draw seed, dataset): two datasets never share a stream."""
    return int(hashlib.sha256(f"{seed}/{name}".encode()).hexdigest()[:8], 16)


def create(name: str, settings: Settings, seed: int = 0, size: int = 1) -> Any:
    """A reasoning-gym dataset; an unknown name or a bad setting raises ValueError naming it."""
    rg = require()
    if name not in rg.factory.DATASETS:
        close = [n for n in dataset_names() if name.split("_")[0] in n][:8]
        raise ValueError(f"unknown reasoning-gym dataset {name!r}"
                         + (f"; similar: {close}" if close else "") + " (graftpool.rg_tasks.dataset_names())")
    for reserved in ("seed", "size"):
        if reserved in settings:
            raise ValueError(f"{name}: {reserved!r} is set by the source (its 'seed' and 'size'), not per dataset")
    try:
        return rg.create_dataset(name, seed=seed, size=size, **dict(settings))
    except Exception as exc:  # noqa: BLE001 - a config class's own check may raise anything
        raise ValueError(f"{name}: bad generator settings {dict(settings)}: {type(exc).__name__}: {exc}") from None


def check_datasets(datasets: Mapping[str, Settings], weights: Mapping[str, float] | None = None) -> None:
    """Raise ValueError for no dataset, an unknown one, bad settings or weights naming none."""
    if not datasets:
        raise ValueError("name at least one reasoning-gym dataset, e.g. {basic_arithmetic: {}}")
    for name, settings in datasets.items():
        if not isinstance(settings, Mapping):
            raise ValueError(f"{name}: generator settings must be a mapping, got {settings!r}")
        try:  # the settings travel to the verifier actors as JSON
            json.dumps(dict(settings))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{name}: generator settings must be plain YAML values: {exc}") from None
        create(name, settings)
    if weights:
        unknown = sorted(set(weights) - set(datasets))
        if unknown:
            raise ValueError(f"weights for datasets not listed: {unknown}; listed: {sorted(datasets)}")


def generate_rg_problems(
    datasets: Mapping[str, Settings],
    count: int,
    seed: int | str,
    split: Split = "all",
    weights: Mapping[str, float] | None = None,
    unique: bool = True,
    instruction: str = INSTRUCTION,
) -> list[Problem]:
    """Draw ``count`` problems from a mix of reasoning-gym datasets, deterministic in ``seed``.

    Each draw picks a dataset (uniformly, or by ``weights``; a dataset left out of ``weights``
    gets 0) and takes its generator's next entry, keeping it when its question is on ``split``'s
    side of the hash partition (and, with ``unique``, new). The solution (a warm start's target)
    is the :data:`WORKED` form where the dataset has one, else the boxed answer. Raises
    ValueError when a dataset cannot supply enough distinct questions.
    """
    check_datasets(datasets, weights)
    names = list(datasets)
    probs = [float((weights or {}).get(n, 0.0 if weights else 1.0)) for n in names]
    if min(probs) < 0 or sum(probs) <= 0:
        raise ValueError(f"dataset weights must be non-negative with a positive sum: {dict(zip(names, probs, strict=True))}")
    budget = 50 * count + 1000  # entries generated per dataset at most
    generators = {n: create(n, datasets[n], seed=_stream_seed(seed, n), size=budget) for n in names}
    cursor = dict.fromkeys(names, 0)
    rng = random.Random(f"rg-mix/{seed}")
    seen: set[str] = set()
    out: list[Problem] = []
    while len(out) < count:
        name = rng.choices(names, probs)[0]
        while True:
            if cursor[name] >= budget:
                raise ValueError(f"reasoning-gym dataset {name!r}: could not draw {count} distinct {split} "
                                 f"questions from {budget} entries; widen its settings or lower 'size'")
            entry = generators[name][cursor[name]]
            cursor[name] += 1
            question = str(entry["question"])
            if (split == "all" or prompt_split(question) == split) and not (unique and question in seen):
                break
        seen.add(question)
        metadata = {DATASET_KEY: name, SETTINGS_KEY: dict(datasets[name]), ENTRY_KEY: entry}
        solution = WORKED[name](entry) if name in WORKED else None
        out.append(make_problem(name, question, str(entry["answer"]), solution, instruction, metadata=metadata))
    return out
