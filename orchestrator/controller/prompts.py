"""Train and eval problem sets from the config, and the step-wise prompt sampler."""

from __future__ import annotations

import warnings

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


def load_source(source: DataSource, split: str) -> list[Problem]:
    """Problems of one source; synthetic ones come from the fixed train or eval partition, a
    file's from its seeded split when it has ``eval_fraction`` (the train source takes the
    train side, an eval source the held-out side). A file that cannot be read, a mapped
    column it lacks or an empty set is a :class:`ConfigError` naming the source."""
    if source.source == "synthetic":
        problems = generate_problems(source.tasks, source.size, source.seed, split=split,
                                     instruction=source.instruction)
    else:
        try:
            problems = load_table(source.path, source.question_field, source.answer_field,
                                  id_field=source.id_field, task_field=source.task_field,
                                  split=source.split, split_field=source.split_field,
                                  instruction=source.instruction)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"data.{source.name}: {exc}") from None
        if source.eval_fraction is not None:
            train, held = split_train_eval(problems, source.eval_fraction, source.seed)
            problems = train if split == "train" else held
    if not problems:
        raise ConfigError(f"data.{source.name}: the data set is empty")
    return problems


def load_data(train: DataSource, evals: list[DataSource]) -> tuple[list[Problem], dict[str, list[Problem]]]:
    train_problems = load_source(train, "train")
    train_prompts = {p.prompt for p in train_problems}
    eval_sets = {}
    for source in evals:
        problems = load_source(source, "eval")
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
        self.epoch = 0
        self.cursor = 0
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))

    def next_batch(self, size: int) -> list[Problem]:
        batch: list[Problem] = []
        seen: set[str] = set()
        while len(batch) < min(size, len(self.problems)):
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
