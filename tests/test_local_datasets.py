"""Local data sets with mapped columns (``data.train: {source: file, ...}``): JSON Lines,
JSON, Parquet, CSV and Arrow files load with question / answer / id / task fields, a split
column or a seeded train/eval split; a missing column is an error naming the field; URLs
and hub ids are refused (nothing is downloaded)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graftpool.tasks import INSTRUCTION
from orchestrator.config import ConfigError, DataSource, load_config
from orchestrator.controller.prompts import load_data, load_source, verifier_query

ROWS = [{"uid": f"q{i}", "q": f"{i}+{i}=", "gold": str(2 * i), "family": "add" if i % 2 else "double",
         "part": "test" if i % 4 == 0 else "train", "level": i % 3} for i in range(1, 21)]
BASE = {"models": [{"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}}], "exchange": {"name": "none"}}


def _write(path: Path, rows: list[dict] = ROWS) -> Path:
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif suffix == ".csv":
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif suffix == ".arrow":
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def _source(path: Path, **fields) -> DataSource:
    return DataSource(source="file", path=path, question_field="q", answer_field="gold", **fields)


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet", ".csv", ".arrow"])
def test_mapped_fields_load_from_every_format(tmp_path, suffix):
    path = _write(tmp_path / f"arith{suffix}")
    problems = load_source(_source(path, id_field="uid", task_field="family"), "train")
    assert [p.prompt_id for p in problems] == [r["uid"] for r in ROWS]
    assert [(p.question, p.prompt, p.answer) for p in problems[:2]] == [
        ("1+1=", "1+1=" + INSTRUCTION, "2"), ("2+2=", "2+2=" + INSTRUCTION, "4")]
    assert [p.task for p in problems[:2]] == ["add", "double"]
    # the other columns are the problem's metadata, and reach a reward plugin
    level = problems[0].metadata["level"]
    assert str(level) == "1" and set(problems[0].metadata) == {"part", "level"}
    query = verifier_query(problems[0], "\\boxed{2}")
    assert query.question == "1+1=" and query.metadata["task"] == "add" and query.metadata["prompt_id"] == "q1"
    # defaults: the task is the file's stem, the id a hash of task and prompt
    plain = load_source(_source(path), "train")
    assert {p.task for p in plain} == {"arith"} and plain[0].prompt_id.startswith("arith-")


def test_jsonl_and_parquet_sources_keep_their_older_key_names(tmp_path):
    for suffix, source in ((".jsonl", "jsonl"), (".parquet", "parquet")):
        path = _write(tmp_path / f"data{suffix}")
        data = DataSource.model_validate({"source": source, "path": str(path), "problem_key": "q", "answer_key": "gold"})
        assert (data.question_field, data.answer_field) == ("q", "gold")
        assert len(load_source(data, "train")) == len(ROWS)
    with pytest.raises(ValueError, match="give question_field only"):
        DataSource.model_validate({"source": "jsonl", "path": str(path.with_suffix(".jsonl")),
                                   "problem_key": "q", "question_field": "q"})


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
@pytest.mark.parametrize(("field", "value"), [("question_field", "question"), ("answer_field", "solution"),
                                              ("id_field", "id"), ("task_field", "kind"),
                                              ("split_field", "fold")])
def test_a_missing_column_is_an_error_naming_the_field(tmp_path, suffix, field, value):
    path = _write(tmp_path / f"arith{suffix}")
    fields = {"question_field": "q", "answer_field": "gold", field: value}
    if field == "split_field":
        fields["split"] = "train"
    source = DataSource(source="file", path=path, name="mine", **fields)
    with pytest.raises(ConfigError) as err:
        load_source(source, "train")
    assert f"data.mine: {path}: no column {value!r} ({field}); the columns are" in str(err.value)
    assert "'gold'" in str(err.value)  # the columns the file has


def test_empty_values_repeated_ids_and_empty_splits_are_named(tmp_path):
    rows = [dict(r) for r in ROWS[:3]]
    rows[1]["gold"] = " "
    with pytest.raises(ConfigError, match=r"row 2 has no 'gold'"):
        load_source(_source(_write(tmp_path / "blank.jsonl", rows)), "train")
    rows = [dict(r) for r in ROWS[:3]]
    rows[2]["uid"] = "q1"
    with pytest.raises(ConfigError, match=r"row 3: id 'q1' \('uid', id_field\) is repeated"):
        load_source(_source(_write(tmp_path / "dup.parquet", rows), id_field="uid"), "train")
    with pytest.raises(ConfigError, match=r"no rows with part == 'dev'; its values are \['test', 'train'\]"):
        load_source(_source(_write(tmp_path / "a.csv"), split="dev", split_field="part"), "train")


def test_a_split_column_selects_rows(tmp_path):
    path = _write(tmp_path / "arith.parquet")
    train = load_source(_source(path, split="train", split_field="part"), "train")
    test = load_source(_source(path, split="test", split_field="part", name="test"), "eval")
    assert len(train) == 15 and len(test) == 5
    assert {p.question for p in test} == {r["q"] for r in ROWS if r["part"] == "test"}


def test_a_seeded_train_eval_split_of_one_file(tmp_path):
    path = _write(tmp_path / "arith.jsonl")
    train, evals = load_data(_source(path, eval_fraction=0.25, seed=3),
                             [_source(path, eval_fraction=0.25, seed=3, name="held")])
    held = evals["held"]
    assert len(held) == 5 and len(train) == 15
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert {p.question for p in train} | {p.question for p in held} == {r["q"] for r in ROWS}
    again, _ = load_data(_source(path, eval_fraction=0.25, seed=3), [])
    other, _ = load_data(_source(path, eval_fraction=0.25, seed=4), [])
    assert [p.prompt_id for p in again] == [p.prompt_id for p in train]
    assert {p.prompt_id for p in other} != {p.prompt_id for p in train}


def test_a_config_with_a_file_source(tmp_path):
    path = _write(tmp_path / "arith.csv")
    config = load_config(data={**BASE, "data": {
        "train": {"source": "file", "path": str(path), "question_field": "q", "answer_field": "gold",
                  "eval_fraction": 0.2, "seed": 1},
        "eval": [{"name": "held", "source": "file", "path": str(path), "question_field": "q",
                  "answer_field": "gold", "eval_fraction": 0.2, "seed": 1}]}})
    train, evals = load_data(config.data.train, config.data.eval)
    assert len(train) == 16 and len(evals["held"]) == 4


@pytest.mark.parametrize(("path", "message"), [
    ("https://example.com/train.parquet", "is a URL"),
    ("hf://datasets/openai/gsm8k", "is a URL"),
    ("openai/gsm8k", "looks like a Hugging Face hub id"),
])
def test_urls_and_hub_ids_are_refused(path, message):
    with pytest.raises(ConfigError) as err:
        load_config(data={**BASE, "data": {"train": {"source": "file", "path": path}}})
    assert "data.train.path" in str(err.value) and message in str(err.value)
    assert "nothing is downloaded" in str(err.value)


def test_unsupported_files_are_refused(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("x")
    with pytest.raises(ConfigError, match=r"source 'file' reads .json, .jsonl, .parquet, .csv, .arrow files"):
        load_config(data={**BASE, "data": {"train": {"source": "file", "path": str(path)}}})
    parquet = _write(tmp_path / "d.parquet")
    with pytest.raises(ConfigError, match=r"source 'jsonl' reads .jsonl, .json files"):
        load_config(data={**BASE, "data": {"train": {"source": "jsonl", "path": str(parquet)}}})
