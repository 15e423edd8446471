"""Synthetic tasks: correct answers, determinism, held-out eval split, file loaders."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from graftpool.data_files import load_table, split_train_eval
from graftpool.tasks import (
    INSTRUCTION,
    TASKS,
    generate_problems,
    make_problem,
    prompt_split,
    worked_solution,
)


def _expected(task: str, prompt: str) -> int:
    """An independent re-computation of each task's answer from its prompt text."""
    nums = [int(x) for x in re.findall(r"\d+", prompt)]
    if task == "add":
        return nums[0] + nums[1]
    if task == "sub":
        return nums[0] - nums[1]
    if task == "mod":
        return nums[0] % nums[1]
    if task == "linear":
        a, b, c = nums
        assert (c - b) % a == 0
        return (c - b) // a
    if task == "digits":
        return sum(int(d) for d in str(nums[0]))
    letter, text = re.fullmatch(r"(\w) in (\w+)=", prompt).groups()
    return text.count(letter)


def test_every_task_is_correct_short_and_boxed():
    problems = generate_problems(list(TASKS), 600, seed=0)
    assert {p.task for p in problems} == set(TASKS)
    for p in problems:
        assert int(p.answer) == _expected(p.task, p.question) >= 0, p
        assert len(p.question) <= 14, p.question
        assert p.prompt == p.question + " Output the final answer within \\boxed{}."
        assert p.solution == f"{p.question}{p.answer}, \\boxed{{{p.answer}}}"
        assert p.solution == worked_solution(p.question, p.answer)
        assert p.prompt_id.startswith(f"{p.task}-")


def test_instruction_is_configurable():
    plain = generate_problems(["add"], 5, seed=0, instruction="")
    assert [p.prompt for p in plain] == [p.question for p in plain]
    paper = generate_problems(["add"], 5, seed=0)
    assert [p.question for p in paper] == [p.question for p in plain]
    assert all(p.prompt.endswith(INSTRUCTION) for p in paper)


def test_generation_is_deterministic_distinct_and_ids_stable():
    a = generate_problems(["add", "count"], 200, seed=5)
    assert a == generate_problems(["add", "count"], 200, seed=5)
    assert a != generate_problems(["add", "count"], 200, seed=6)
    assert len({p.prompt for p in a}) == len({p.prompt_id for p in a}) == 200
    assert make_problem(a[0].task, a[0].question, a[0].answer).prompt_id == a[0].prompt_id


def test_weights_unique_and_errors():
    only_add = generate_problems({"add": 1.0, "sub": 0.0}, 50, seed=0)
    assert {p.task for p in only_add} == {"add"}
    skewed = generate_problems({"mod": 0.9, "count": 0.1}, 400, seed=0)
    assert sum(p.task == "mod" for p in skewed) > 300
    repeats = generate_problems(["mod"], 2000, seed=0, unique=False)  # > the mod space
    assert len({p.prompt for p in repeats}) < 2000
    with pytest.raises(ValueError, match="unknown task"):
        generate_problems(["add", "nope"], 5, seed=0)
    with pytest.raises(ValueError, match="distinct"):
        generate_problems(["mod"], 1000, seed=0, split="eval")
    excluded = {p.question for p in only_add}
    assert not excluded & {p.question for p in generate_problems(["add"], 50, 0, exclude=excluded)}


def test_train_and_eval_splits_never_overlap():
    train = generate_problems(list(TASKS), 3000, seed=1, split="train")
    evals = generate_problems(list(TASKS), 600, seed=2, split="eval")
    assert not {p.prompt for p in train} & {p.prompt for p in evals}
    assert all(prompt_split(p.question) == "train" for p in train)
    assert all(prompt_split(p.question) == "eval" for p in evals)


def test_split_train_eval_dedupes_and_is_seeded():
    problems = generate_problems(list(TASKS), 100, seed=0)
    dup = make_problem("other", problems[0].question, problems[0].answer)
    train, held = split_train_eval([*problems, dup], 0.25, seed=3)
    assert (len(train), len(held)) == (75, 25)
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert (train, held) == split_train_eval([*problems, dup], 0.25, seed=3)
    with pytest.raises(ValueError, match="eval_fraction"):
        split_train_eval(problems, 1.5, seed=0)


def _rows():
    return [{"question": "2+2=", "gold": 4}, {"question": "what is 3*3?", "gold": "9"}]


def test_load_jsonl_and_parquet(tmp_path):
    jsonl = tmp_path / "arith.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n\n")
    parquet = tmp_path / "arith.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "gold": str(r["gold"])} for r in _rows()]), parquet)
    for path in (jsonl, parquet):
        problems = load_table(path, question_field="question", answer_field="gold")
        assert [(p.prompt, p.answer, p.task) for p in problems] == [
            ("2+2=" + INSTRUCTION, "4", "arith"),
            ("what is 3*3?" + INSTRUCTION, "9", "arith"),
        ]
        assert problems[1].solution == "\\boxed{9}"
        raw = load_table(path, question_field="question", answer_field="gold", instruction="")
        assert [p.prompt for p in raw] == ["2+2=", "what is 3*3?"]


def test_loaders_fail_clearly(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"problem": "1+1="}) + "\n")
    with pytest.raises(ValueError, match=r"bad\.jsonl: no column 'answer' \(answer_field\)"):
        load_table(bad)
    blank = tmp_path / "blank.parquet"
    pq.write_table(
        pa.Table.from_pylist([{"problem": "1+1=", "answer": "2"}, {"problem": "x", "answer": " "}]),
        blank,
    )
    with pytest.raises(ValueError, match=r"blank\.parquet: row 2 has no 'answer'"):
        load_table(blank)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.jsonl: no rows"):
        load_table(empty)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"problem": "1+1=", "answer": "2"}\n{oops\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl: line 2"):
        load_table(broken)
    with pytest.raises(ValueError, match="unsupported"):
        load_table(tmp_path / "data.txt")


def test_a_nested_column_is_refused_not_read_as_its_repr(tmp_path):
    """Issue #51's forty-sixth read: a verl-style Parquet file (a chat-message ``prompt`` list, a
    ``reward_model`` struct holding the ``ground_truth``) mapped as the question and the answer was
    read as their Python reprs: a prompt of message dicts, and a gold answer that the math verifier
    scores 0 against a correct response. Now refused, naming the row, the column and its field."""
    from workers.verify.verifier import make_verifier

    verl = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist([{
        "prompt": [{"role": "user", "content": "What is 6*7? Output the final answer within \\boxed{}."}],
        "reward_model": {"style": "rule", "ground_truth": "42"}, "gt": "42", "question": "What is 6*7?"}]), verl)
    with pytest.raises(ValueError, match=r"verl\.parquet: row 1: column 'reward_model' \(answer_field\) holds a dict"):
        load_table(verl, question_field="question", answer_field="reward_model")
    with pytest.raises(ValueError, match=r"row 1: column 'prompt' \(question_field\) holds a list"):
        load_table(verl, question_field="prompt", answer_field="gt")
    jsonl = tmp_path / "ids.jsonl"
    jsonl.write_text(json.dumps({"problem": "1+1=", "answer": "2", "key": {"n": 1}}) + "\n")
    with pytest.raises(ValueError, match=r"column 'key' \(id_field\) holds a dict"):
        load_table(jsonl, id_field="key")
    # the flat columns load, and the gold answer is the one a correct response matches
    problem, = load_table(verl, question_field="question", answer_field="gt")
    assert problem.answer == "42" and problem.metadata["reward_model"]["ground_truth"] == "42"
    assert make_verifier("math").verify("6*7=42, so \\boxed{42}", problem.answer).reward == 1.0


def test_an_error_under_split_names_the_files_row(tmp_path):
    """Issue #51's forty-seventh read: with ``split`` the rows were numbered after the filter, so the
    error for a bad value named the n-th row of the split (row 1 here), not the file's row (3)."""
    rows = [{"problem": "1+1=", "answer": "2", "split": "train"},
            {"problem": "2+2=", "answer": "4", "split": "train"},
            {"problem": "3+3=", "answer": {"value": "6"}, "split": "test"},
            {"problem": "4+4=", "answer": "", "split": "test"}]
    data = tmp_path / "mixed.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"mixed\.jsonl: row 3: column 'answer' \(answer_field\) holds a dict"):
        load_table(data, split="test")
    rows[2]["answer"] = "6"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"mixed\.jsonl: row 4 has no 'answer'"):
        load_table(data, split="test")
    assert [p.answer for p in load_table(data, split="train")] == ["2", "4"]


@pytest.mark.parametrize("style", ["explain", "steps", "prose"])
def test_paper_like_styles_are_long_and_the_answer_is_a_small_part(style):
    """At least 40 characters (tokens of a char model), the boxed answer under 20% of them,
    and the reward still reads the boxed answer; the style's slip boxes the answer plus ten."""
    from graftpool.tasks import SLIPPED_STYLES, SOLUTION_STYLES, generate_problems

    for p in generate_problems(list(TASKS), 60, seed=4, style=style):
        assert p.solution == SOLUTION_STYLES[style](p.question, p.answer)
        assert len(p.solution) >= 40
        assert len(p.answer) / len(p.solution) < 0.2
        assert p.solution.count(f"\\boxed{{{p.answer}}}") == 1 and p.solution.rstrip(".").endswith("}")
        slip = SLIPPED_STYLES[style](p.question, p.answer)
        assert f"{p.question}{p.answer}" in slip and slip.rstrip(".").endswith(f"\\boxed{{{int(p.answer) + 10}}}")


@pytest.mark.parametrize("style", ["worked", "explain", "steps", "prose"])
def test_result_slip_writes_a_wrong_result_throughout_and_never_the_answer(style):
    from graftpool.tasks import SOLUTION_STYLES, generate_problems, slipped_solution

    for p in generate_problems(list(TASKS), 60, seed=4, style=style):
        wrong = str(int(p.answer) + 11)
        slip = slipped_solution("result", style, p.question, p.answer)
        assert slip == SOLUTION_STYLES[style](p.question, wrong)  # the style's own text, another number
        assert not re.search(re.escape(p.question + p.answer) + r"(?!\d)", slip) and slip.count(f"\\boxed{{{wrong}}}") == 1
        assert len(wrong) > len(p.answer) or (wrong[-1] != p.answer[-1] and wrong[-2] != p.answer[-2])
    with pytest.raises(ValueError, match="slip kind"):
        slipped_solution("first_step", "explain", "1+1=", "2")


def test_every_style_has_its_slip():
    from graftpool.tasks import SLIPPED_STYLES, SOLUTION_STYLES

    assert set(SLIPPED_STYLES) == set(SOLUTION_STYLES)


def test_unknown_style_names_the_known_ones():
    from graftpool.tasks import generate_problems

    with pytest.raises(ValueError, match="known: \\['explain', 'prose', 'steps', 'worked'\\]"):
        generate_problems(["add"], 2, seed=0, style="essay")
