"""``data:``: the train and eval sets (synthetic tasks, reasoning-gym generators or local files)
and the verifier."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from graftpool.sections import Strict
from graftpool.tasks import INSTRUCTION, check_task_mix

FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
"""Local file suffixes ``source: file`` reads (graftpool.data_files.read_table), and their format."""


class DataSource(Strict):
    """Synthetic tasks generated in code, reasoning-gym's generators, or a local data file with
    mapped columns.

    ``file`` reads JSON / JSON Lines, Parquet, CSV and Arrow files, local paths only (nothing
    is downloaded); ``jsonl`` and ``parquet`` are the same reader for those suffixes.
    ``reasoning_gym`` draws ``size`` problems from ``datasets`` (graftpool.rg_tasks)."""

    name: str = "train"
    source: Literal["synthetic", "file", "jsonl", "parquet", "reasoning_gym"] = "synthetic"
    path: Path | None = None
    question_field: str = "problem"  # the column holding the question (problem_key: its older name)
    answer_field: str = "answer"  # the column holding the gold answer (answer_key: its older name)
    id_field: str | None = None  # a column of unique ids to use as prompt ids (default: a hash of the prompt)
    task_field: str | None = None  # a column naming each row's task (default: the file's stem)
    split: str | None = None  # keep only rows whose split_field column equals this
    split_field: str = "split"
    # a seeded split of the file (with ``seed``): the train source takes the train side, an eval
    # source on the same file with the same eval_fraction and seed takes the held-out side
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    tasks: list[str] = Field(default_factory=lambda: ["add"])
    # reasoning_gym: dataset name -> its generator's settings (seed and size come from the source)
    datasets: dict[str, dict[str, Any]] = Field(default_factory=dict)
    size: int = Field(256, ge=1)
    seed: int = 0
    instruction: str = Field(
        INSTRUCTION, description="appended to every question; '' for already formatted files"
    )

    @model_validator(mode="before")
    @classmethod
    def _older_key_names(cls, data: Any) -> Any:
        """``problem_key`` / ``answer_key`` are the older names of ``question_field`` / ``answer_field``."""
        if isinstance(data, dict):
            for old, new in (("problem_key", "question_field"), ("answer_key", "answer_field")):
                if old in data:
                    if new in data:
                        raise ValueError(f"give {new} only ({old} is its older name)")
                    data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data

    @field_validator("path", mode="before")
    @classmethod
    def _local_only(cls, path: Any) -> Any:
        text = str(path) if path is not None else ""
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) or text.startswith("hf:"):
            raise ValueError(f"local files only, nothing is downloaded: {text!r} is a URL; "
                             "download it and give its local path")
        if re.fullmatch(r"[\w.-]+/[\w.-]+", text) and not Path(text).exists() and Path(text).suffix == "":
            raise ValueError(f"local files only, nothing is downloaded: {text!r} looks like a Hugging Face "
                             "hub id; download the data set and give a local file (json, jsonl, parquet, csv, arrow)")
        return path

    @model_validator(mode="after")
    def _reasoning_gym(self) -> DataSource:
        if self.source != "reasoning_gym":
            if self.datasets:
                raise ValueError(f"'datasets' is for source: reasoning_gym, not '{self.source}'")
            return self
        if self.path is not None:
            raise ValueError("source 'reasoning_gym' generates its problems: remove 'path'")
        from graftpool.rg_tasks import check_datasets

        try:
            check_datasets(self.datasets)
        except ImportError as exc:
            raise ValueError(str(exc)) from None
        except ValueError as exc:
            raise ValueError(f"datasets: {exc}") from None
        return self

    @model_validator(mode="after")
    def _known_tasks(self) -> DataSource:
        """A synthetic source's ``tasks``, checked as the generator will (graftpool.tasks.check_task_mix)."""
        if self.source == "synthetic":
            try:
                check_task_mix(dict.fromkeys(self.tasks, 1.0))
            except ValueError as exc:
                raise ValueError(f"tasks: {exc}") from None
        return self

    @model_validator(mode="after")
    def _file_for_files(self) -> DataSource:
        if self.source == "synthetic" and self.path is not None:
            raise ValueError(f"source 'synthetic' generates its problems and would ignore path {self.path}; "
                             f"set source: file (or jsonl, parquet) to read it")
        if self.source not in ("synthetic", "reasoning_gym"):
            if self.path is None:
                raise ValueError(f"source '{self.source}' needs 'path'")
            if not self.path.exists():
                raise ValueError(f"no data file at {self.path}")
            suffix = self.path.suffix.lower()
            allowed = {"jsonl": (".jsonl", ".json"), "parquet": (".parquet",)}.get(self.source, tuple(FILE_FORMATS))
            if not self.path.is_file() or suffix not in allowed:
                raise ValueError(f"source '{self.source}' reads {', '.join(allowed)} files, got {self.path}")
        return self


CHARS_PER_TOKEN = 256
"""The most characters one generated token decodes to, for ``data.max_response_chars``'s
default. A byte-level BPE token (GPT-2, Llama 3, Qwen) decodes to at most one character per
byte, and the longest tokens of the vocabularies in use, runs of spaces, dashes or ``=`` in
code-trained BPEs, are well under 256 bytes; a SentencePiece piece is at most 16 characters
by default (``max_sentencepiece_length``), a character vocabulary's token one. So ``n`` new
tokens decode to fewer than ``n * 256`` characters, and no response a generator can produce
under ``generation.max_new_tokens`` is capped (a vocabulary with longer tokens: set
``data.max_response_chars``). Even past the cap a boxed answer is still judged, on the
response's tail (``workers.verify.verifier.cap_tail``). The price of a generous bound is small: the
boxed-answer verifiers slice the tail before any parsing, and only a box's content reaches
math-verify."""


def derived_response_chars(max_new_tokens: int) -> int:
    """``data.max_response_chars`` left null: ``max_new_tokens * CHARS_PER_TOKEN``, with the
    largest ``generation.max_new_tokens`` of the pool (``Config.response_chars``)."""
    return max_new_tokens * CHARS_PER_TOKEN


class DataConfig(Strict):
    train: DataSource = DataSource()
    eval: list[DataSource] = Field(default_factory=list)
    # math | exact | reasoning_gym | python:package.module:function | python:/path/to/file.py:function (a reward
    # plugin, workers.verify.plugin_verifier)
    verifier: str = "math"
    verifier_actors: int = Field(2, ge=1)
    # seconds of a verifier child's CPU time per answer, 10x that of wall clock at most (workers.verify.cpu_limit)
    verifier_timeout_s: float = Field(2.0, gt=0)
    # characters of a response the verifiers read: math, exact and reasoning_gym judge its last
    # this many (the final \boxed{} is at the end), a reward plugin refuses a longer one (reward 0);
    # either way it counts in verify/capped. null: derived from generation.max_new_tokens
    # (derived_response_chars), long enough for any response the models can generate
    max_response_chars: int | None = Field(None, gt=0)
    # answers the verifier's settle() decides (integers, no boxed answer, ...) are judged in the
    # driver with the same verdict, never sent to a verifier actor; false: every answer goes
    fast_path: bool = True

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, name: str) -> str:
        from workers.verify.verifier import PLUGIN_PREFIX, available_verifiers

        if name.startswith(PLUGIN_PREFIX):
            from workers.verify.plugin_verifier import check_target

            return PLUGIN_PREFIX + check_target(name[len(PLUGIN_PREFIX):])
        builtin = [v for v in available_verifiers() if v != "python"]
        if name not in builtin:
            raise ValueError(f"expected one of {builtin} or python:package.module:function "
                             f"(python:/path/to/file.py:function), got {name!r}")
        return name

    @field_validator("eval")
    @classmethod
    def _eval_names_differ(cls, sources: list[DataSource]) -> list[DataSource]:
        """Each eval set's ``name`` keys its results and metrics (``eval/<name>/...``): two sources
        of one name would silently leave one set unevaluated."""
        first: dict[str, int] = {}
        for i, source in enumerate(sources):
            if source.name in first:
                raise ValueError(f"each eval set needs a name of its own (its metrics are eval/<name>/...): "
                                 f"data.eval.{first[source.name]} and data.eval.{i} are both named {source.name!r}; "
                                 f"set data.eval.{i}.name")
            first[source.name] = i
        return sources

    @model_validator(mode="after")
    def _reasoning_gym_scores_its_own(self) -> DataConfig:
        if self.verifier == "reasoning_gym":
            for where, source in [("train", self.train), *((f"eval.{i}", s) for i, s in enumerate(self.eval))]:
                if source.source != "reasoning_gym":
                    raise ValueError(f"verifier 'reasoning_gym' scores source: reasoning_gym data only; "
                                     f"data.{where} is source: {source.source}")
        return self
