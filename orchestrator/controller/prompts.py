"""Train and eval problem sets from the config, and the step-wise prompt sampler."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from graftpool.data_files import load_table, split_train_eval
from graftpool.tasks import Problem, generate_problems
from orchestrator.config import ConfigError, DataSource
from workers.verify.verifier import Query


def verifier_query(problem: Problem, response: str) -> Query:
    """What the verifier judges for one response: the pair, plus the question and metadata
    (``task``, ``prompt_id`` and a loaded row's other columns) that a reward plugin is given."""
    metadata = {"task": problem.task, "prompt_id": problem.prompt_id, **problem.metadata}
    return Query(response, problem.answer, problem.question, metadata)


def _synthetic(source: DataSource, split: str, run_seed: int) -> list[Problem]:
    return generate_problems(source.tasks, source.size, source.seed, split=split, instruction=source.instruction)


def _reasoning_gym(source: DataSource, split: str, run_seed: int) -> list[Problem]:
    """``size`` problems from the source's reasoning-gym datasets, drawn with the run's seed and
    the source's: train sources from the train side of the question partition, eval sources
    from the eval side, so the two never overlap (graftpool.rg_tasks)."""
    from graftpool.rg_tasks import generate_rg_problems

    return generate_rg_problems(source.datasets, source.size, f"{run_seed}/{source.seed}", split=split,
                                instruction=source.instruction)


def _file(source: DataSource, split: str, run_seed: int) -> list[Problem]:
    problems = load_table(source.path, source.question_field, source.answer_field,
                          id_field=source.id_field, task_field=source.task_field,
                          split=source.split, split_field=source.split_field,
                          instruction=source.instruction)
    if source.eval_fraction is not None:
        train, held = split_train_eval(problems, source.eval_fraction, source.seed)
        problems = train if split == "train" else held
    return problems


LOADERS: dict[str, Callable[[DataSource, str, int], list[Problem]]] = {
    "synthetic": _synthetic, "reasoning_gym": _reasoning_gym, "file": _file, "jsonl": _file, "parquet": _file}
"""``data.*.source`` -> the function that makes its problems for one side (train or eval)."""


def load_source(source: DataSource, split: str, run_seed: int = 0) -> list[Problem]:
    """Problems of one source; synthetic and reasoning-gym ones come from the fixed train or
    eval partition, a file's from its seeded split when it has ``eval_fraction`` (the train
    source takes the train side, an eval source the held-out side). A file that cannot be read,
    a mapped column it lacks, a generator that runs out or an empty set is a
    :class:`ConfigError` naming the source."""
    try:
        problems = LOADERS[source.source](source, split, run_seed)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"data.{source.name}: {exc}") from None
    if not problems:
        raise ConfigError(f"data.{source.name}: the data set is empty")
    return problems


def load_data(train: DataSource, evals: list[DataSource],
              run_seed: int = 0) -> tuple[list[Problem], dict[str, list[Problem]]]:
    """The train set and each eval set by name; ``run_seed`` (``run.seed``) seeds the
    reasoning-gym draws."""
    train_problems = load_source(train, "train", run_seed)
    train_prompts = {p.prompt for p in train_problems}
    eval_sets = {}
    for source in evals:
        problems = load_source(source, "eval", run_seed)
        overlap = sum(p.prompt in train_prompts for p in problems)
        if overlap:
            warnings.warn(f"data.eval '{source.name}': {overlap} prompts also in the train set", stacklevel=2)
        eval_sets[source.name] = problems
    return train_problems, eval_sets


class PromptSampler:
    """Shuffled passes over the train set; the same batch goes to every model each step.

    Its state (epoch, cursor) is part of a checkpoint, so a resumed run sees the same
    prompts an uninterrupted one would.
    """

    def __init__(self, problems: list[Problem], seed: int):
        self.problems = problems
        self.seed = seed
        self.distinct = len({p.prompt_id for p in problems})  # a file's repeated question is one prompt id
        self.epoch = 0
        self.cursor = 0
        self._order = self._shuffle(0)
        self._said_short = False

    def _shuffle(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next_batch(self, size: int) -> list[Problem]:
        """``size`` distinct prompts (``algorithm.prompt_batch``), or every prompt where the set holds
        fewer: said once, since every step then trains on the same prompts. Distinct means by
        prompt id: a question a file repeats (no ``id_field``: the id is a hash of the prompt) is
        one prompt, so the batch is ``min(size, distinct ids)``, never more than the set can fill."""
        if size > self.distinct and not self._said_short:
            self._said_short = True
            rows = "" if self.distinct == len(self.problems) else f" ({len(self.problems)} rows)"
            warnings.warn(f"data.train holds {self.distinct} prompts{rows}, fewer than algorithm.prompt_batch "
                          f"({size}): every step trains on all {self.distinct}", stacklevel=2)
        batch: list[Problem] = []
        seen: set[str] = set()
        while len(batch) < min(size, self.distinct):
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._shuffle(self.epoch)
            problem = self.problems[self._order[self.cursor]]
            self.cursor += 1
            if problem.prompt_id not in seen:
                seen.add(problem.prompt_id)
                batch.append(problem)
        return batch

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._shuffle(self.epoch)
