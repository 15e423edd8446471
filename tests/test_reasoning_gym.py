"""reasoning-gym as a task source (graftpool/rg_tasks.py, workers/verify/rg_verifier.py): problems drawn
from its generators, train and eval sides disjoint and seeded; the ``reasoning_gym`` verifier
agrees with each dataset's own ``score_answer`` on right and wrong answers; the zoo's warm start
draws from the same generators; a pair run on two families end to end (store, per-task metrics,
eval). The [reasoning-gym] extra is installed by ``make install``; without it these tests skip."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml

rg = pytest.importorskip("reasoning_gym", reason="the [reasoning-gym] extra is not installed")

from graftpool.rg_tasks import DATASET_KEY, ENTRY_KEY, generate_rg_problems  # noqa: E402
from graftpool.tasks import prompt_split  # noqa: E402
from orchestrator.config import ConfigError, load_config  # noqa: E402
from orchestrator.controller.prompts import load_data, verifier_query  # noqa: E402
from workers.verify.answer import extract_boxed  # noqa: E402
from workers.verify.rg_verifier import ReasoningGymVerifier  # noqa: E402
from workers.verify.verifier import make_verifier  # noqa: E402
from workers.zoo.zoo_spec import ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RG_PAIR = ROOT / "configs" / "rg_pair.yaml"
TWO = {"basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                            "operators": ["+", "-"], "allow_parentheses": False, "allow_negation": False},
       "spell_backward": {"min_word_len": 3, "max_word_len": 5}}
# families with exact-match, partial-credit and parsed (numeric, list, fraction) scorers
SCORED = {**TWO, "letter_counting": {"min_words": 1, "max_words": 2}, "gcd": {"max_value": 100},
          "fraction_simplification": {}, "number_sorting": {"min_numbers": 2, "max_numbers": 3},
          "caesar_cipher": {"min_words": 1, "max_words": 2}, "simple_equations": {}}


def _dataset(name: str, settings: dict):
    return rg.create_dataset(name, **settings)


def _responses(answer: str, others: list[str], rng: random.Random) -> list[str]:
    """Right and wrong responses to one problem: the gold answer boxed, near misses (a
    character changed, added or dropped, another case, spaces), another problem's answer, an
    empty box, no box at all."""
    i = rng.randrange(len(answer))
    near = [answer[:i] + ("x" if answer[i] != "x" else "y") + answer[i + 1:], answer + "7", answer[:-1] or "0",
            answer.swapcase(), f" {answer} ", rng.choice(others)]
    return ([f"So the answer is \\boxed{{{answer}}}."] + [f"\\boxed{{{w}}}" for w in near]
            + ["\\boxed{}", f"the answer is {answer}"])


def test_the_scorer_agrees_with_reasoning_gyms_own_score_answer():
    """A few hundred generated answers, right and wrong, through the verifier's child process:
    each reward is the dataset's ``score_answer`` of the boxed content (None where there is no
    box: some datasets give that 0.01)."""
    rng = random.Random(0)
    problems = generate_rg_problems(SCORED, 48, seed=0, split="train")
    datasets = {name: _dataset(name, settings) for name, settings in SCORED.items()}
    answers = {name: [p.answer for p in problems if p.task == name] for name in SCORED}
    queries, expected = [], []
    for p in problems:
        entry = p.metadata[ENTRY_KEY]
        for response in _responses(p.answer, answers[p.task], rng):
            queries.append(verifier_query(p, response))
            expected.append(datasets[p.task].score_answer(extract_boxed(response), entry))
    assert len(queries) >= 300 and {p.task for p in problems} == set(SCORED)
    with ReasoningGymVerifier(timeout_s=10.0) as verifier:
        verdicts = verifier.verify_batch(queries)
    assert [v.reward for v in verdicts] == pytest.approx(expected, abs=0, rel=0)
    kinds = Counter("correct" if r == 1.0 else "wrong" if r == 0.0 else "partial" for r in expected)
    assert kinds["correct"] >= len(problems) and kinds["wrong"] > 100 and kinds["partial"] > 10, kinds
    for verdict, reward in zip(verdicts, expected, strict=True):
        assert verdict.reason == {1.0: "correct", 0.0: "wrong answer"}.get(reward, f"partial {reward:.4g}")


def test_a_scorer_that_raises_or_a_problem_from_elsewhere_scores_zero_with_a_reason():
    problem = generate_rg_problems(TWO, 1, seed=0, split="train")[0]
    broken = dict(problem.metadata, **{ENTRY_KEY: {"question": "q", "metadata": {}}})  # no 'answer'
    verifier = make_verifier("reasoning_gym", timeout_s=10.0)
    try:
        verdicts = verifier.verify_batch([("\\boxed{1}", "1", "q", {**broken, DATASET_KEY: problem.task}),
                                          ("\\boxed{1}", "1", "q", {"task": "add"}), ("\\boxed{1}", "1")])
    finally:
        verifier.close()
    assert verdicts[0].reward == 0.0 and verdicts[0].reason.startswith(f"reasoning_gym {problem.task} failed: raised KeyError")
    assert verdicts[1].reward == verdicts[2].reward == 0.0
    assert verdicts[1].reason.startswith("not a reasoning-gym problem")


def test_a_long_chain_of_thought_is_judged_on_its_tail_over_max_chars():
    """data.max_response_chars: the scorer gets the final box of a response longer than the cap
    (its tail); it was once refused with reward 0 ("too long") over 10,000 characters."""
    problem = generate_rg_problems(TWO, 1, seed=0, split="train")[0]
    response = "Let me work this out carefully. " * 400 + f"So the answer is \\boxed{{{problem.answer}}}."
    with ReasoningGymVerifier(timeout_s=10.0, max_chars=1000) as verifier:
        capped, short = verifier.verify_batch([verifier_query(problem, response),
                                               verifier_query(problem, f"\\boxed{{{problem.answer}}}")])
    assert len(response) > 10_000
    assert (capped.reward, capped.reason) == (1.0, f"correct (capped: judged the last 1000 of {len(response)} chars)")
    assert (short.reward, short.reason) == (1.0, "correct")


def test_train_and_eval_sets_are_disjoint_and_drawn_with_the_run_seed():
    config = load_config(RG_PAIR, ["data.train.size=300", "data.eval.0.size=60"])
    train, evals = load_data(config.data.train, config.data.eval, run_seed=0)
    held = evals["rg"]
    assert len(train) == 300 and len(held) == 60
    assert {p.prompt for p in train}.isdisjoint(p.prompt for p in held)
    assert {prompt_split(p.question) for p in train} == {"train"} and {prompt_split(p.question) for p in held} == {"eval"}
    assert {p.task for p in train} == {p.task for p in held} == set(config.data.train.datasets)
    assert all(p.prompt_id.startswith(p.task + "-") for p in train) and len({p.prompt_id for p in train}) == 300
    again, _ = load_data(config.data.train, [], run_seed=0)
    other, _ = load_data(config.data.train, [], run_seed=1)
    assert [p.prompt_id for p in again] == [p.prompt_id for p in train]
    assert len({p.prompt for p in other} & {p.prompt for p in train}) < 150  # another draw


@pytest.mark.parametrize(("override", "message"), [
    ("data.train.datasets={no_such_family: {}}", "data.train: datasets: unknown reasoning-gym dataset 'no_such_family'"),
    ("data.train.datasets={spell_backward: {bogus: 1}}", "spell_backward: bad generator settings"),
    ("data.train.datasets={spell_backward: {seed: 3}}", "'seed' is set by the source"),
    ("data.train.datasets={}", "name at least one reasoning-gym dataset"),
    ("data.eval=[{name: add, tasks: [add]}]", "verifier 'reasoning_gym' scores source: reasoning_gym data only; data.eval.0"),
    ("models.0.builder.sft_slips={add: 0.5}", "sft_slips, slip and style_mix are for the synthetic tasks"),
    ("models.0.builder.sft_tasks={gcd: 1.0}", "weights for datasets not listed: ['gcd']"),
])
def test_config_errors_name_the_field(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(RG_PAIR, [override])
    assert message in str(err.value)


def test_a_source_too_small_for_its_size_is_an_error_naming_it():
    config = load_config(RG_PAIR, ["data.train.size=200",
                                   "data.train.datasets={basic_arithmetic: {min_terms: 2, max_terms: 2, max_digits: 1, "
                                   "operators: ['+'], allow_parentheses: false, allow_negation: false}}"])
    with pytest.raises(ConfigError, match="data.train: reasoning-gym dataset 'basic_arithmetic': could not draw 200"):
        load_data(config.data.train, [])


def test_the_warm_start_draws_from_the_same_generators():
    config = load_config(RG_PAIR)
    spec: ModelSpec = config.models[0].builder
    problems = spec.sft_data()
    counts = Counter(p.task for p in problems)
    assert set(counts) == set(config.data.train.datasets) and len(problems) == spec.sft_problems
    assert counts.most_common(1)[0][0] == max(spec.sft_tasks, key=spec.sft_tasks.get)
    assert {prompt_split(p.question) for p in problems} == {"train"}  # eval questions stay held out
    for p in problems:  # the worked form where the entry has the work (arithmetic), else the answer
        entry = p.metadata[ENTRY_KEY]
        work = f"{entry['metadata']['expression']} = {p.answer}, " if p.task == "basic_arithmetic" else ""
        assert p.solution == f"{work}\\boxed{{{p.answer}}}"
    weighted = spec.model_copy(update={"sft_tasks": {"spell_backward": 1.0}}).sft_data()
    assert {p.task for p in weighted} == {"spell_backward"}


# ----------------------------------------------------------------------------- a pair run


def _pair_config(tmp_path: Path):
    data = yaml.safe_load(RG_PAIR.read_text())
    data["data"]["train"].update(datasets=TWO, size=64)
    data["data"]["eval"] = [{"name": "rg", "source": "reasoning_gym", "datasets": TWO, "size": 8, "seed": 1}]
    for model, focus in zip(data["models"], TWO, strict=True):  # small warm starts, one focus each
        model["builder"].update(sft_datasets=TWO, sft_tasks={t: 0.8 if t == focus else 0.2 for t in TWO},
                                sft_steps=40, sft_problems=400)
    return load_config(data=data, overrides=[
        "run.steps=2", "run.eval_every=0", "algorithm.prompt_batch=8", "algorithm.n=4", "algorithm.minibatches=2",
        "eval.samples=2", f"run.output_dir={tmp_path}", "run.name=rg"])


@pytest.mark.slow
def test_a_pair_run_on_two_families(tmp_path, ray_local):
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    from orchestrator.controller.loop import train

    config = _pair_config(tmp_path)
    summary = train(config)
    run_dir = tmp_path / "rg"
    problems = {p.prompt_id: p for p in load_data(config.data.train, config.data.eval, config.run.seed)[0]}
    datasets = {name: _dataset(name, settings) for name, settings in TWO.items()}
    # the store: every own row named by its family and scored by that family's score_answer
    rows = ds.dataset(str(run_dir / "trajectories"), format="parquet").to_table().to_pylist()
    own = [r for r in rows if r["kind"] == "own"]
    assert len(own) == 2 * 8 * 4 * 2  # steps x prompts x n x models
    assert {r["task"] for r in rows} <= set(TWO) and {r["task"] for r in own} == set(TWO)
    for r in own:
        problem = problems[r["prompt_id"]]
        assert r["task"] == problem.task
        content = extract_boxed(r["response"])
        expected = datasets[problem.task].score_answer(content, problem.metadata[ENTRY_KEY]) if content else 0.0
        assert r["reward"] == pytest.approx(expected, abs=0, rel=0), (r["response"], problem.answer, r["reason"])
    # per-task metrics each step, per model; the flow matrix as for any run
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    per_model = [r for r in records if r.get("model") and "train/reward_mean" in r.get("metrics", {})]
    assert len(per_model) == 4  # steps x models
    for record in per_model:
        metrics = record["metrics"]
        steps_own = [r for r in own if r["model"] == record["model"] and r["step"] == record["step"]]
        for task in TWO:
            rewards = [r["reward"] for r in steps_own if r["task"] == task]
            if rewards:  # mean over the task's groups of their mean reward (groups are equal-sized)
                assert metrics[f"train/task/{task}/reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
            groups = {r["prompt_id"]: [] for r in steps_own if r["task"] == task}
            for r in steps_own:
                if r["task"] == task:
                    groups[r["prompt_id"]].append(r["reward"])
            all_fail = [max(g) <= 0.5 for g in groups.values()]
            if all_fail:
                assert metrics[f"exchange/task/{task}/all_fail_rate"] == pytest.approx(sum(all_fail) / len(all_fail))
        # what it received per task adds up to what it received, and to its column of the flow matrix
        assert sum(metrics[f"exchange/task/{t}/received"] for t in TWO) == metrics["exchange/received"]
    flows = json.loads((run_dir / "flow_matrix.json").read_text())["steps"]
    assert len(flows) == 2
    # eval: pass@1 per family from the stored responses, logged and in the summary
    evals = pq.read_table(run_dir / "evals" / "step_000002.parquet").to_pylist()
    assert {r["task"] for r in evals} == set(TWO)
    logged = {(r["model"], k): v for r in records if r.get("step") == 2 and r.get("model")
              for k, v in r["metrics"].items() if k.startswith("eval/")}
    for model in summary["models"]:
        by_task = {}
        for task in TWO:
            prompts: dict[str, list[float]] = {}
            for r in evals:
                if r["model"] == model and r["task"] == task:
                    prompts.setdefault(r["prompt_id"], []).append(float(r["reward"] > 0.5))  # successes
            by_task[task] = sum(sum(v) / len(v) for v in prompts.values()) / len(prompts)
            assert logged[(model, f"eval/rg/{task}/pass_at_1")] == pytest.approx(by_task[task])
        assert summary["models"][model]["final_task_pass@1"] == pytest.approx({f"rg/{t}": v for t, v in by_task.items()})
        assert set(summary["models"][model]["final_pass@1"]) == {"rg", "avg"}
