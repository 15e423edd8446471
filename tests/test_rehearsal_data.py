"""The rehearsal's math set (``benchmarks/rehearsal_data.py``, ``make rehearsal``): the parquet
file loads through the run's own file source with ``configs/rehearsal_cpu.yaml``'s data section,
and math-verify judges each gold answer, boxed at the end of a long response, correct (and a
wrong one not), so that a reward of 0 in the rehearsal is the models', not the data's."""

from __future__ import annotations

from pathlib import Path

from benchmarks.rehearsal_data import write_math_parquet
from orchestrator.config import load_config
from orchestrator.controller.prompts import load_data
from workers.verify.math_verifier import MathVerifier

ROOT = Path(__file__).resolve().parent.parent


def test_the_rehearsal_math_set_loads_and_its_answers_verify(tmp_path):
    path = write_math_parquet(tmp_path / "math.parquet", rows=24, seed=0)
    # the main environment has neither vLLM nor DeepSpeed: the data section is what is under test
    backends = [f"models.{i}.{part}.backend={name}" for i in (0, 1)
                for part, name in (("generation", "hf"), ("trainer", "torch"))]
    config = load_config(ROOT / "configs" / "rehearsal_cpu.yaml", [f"data.train.path={path}", *backends])
    train, _ = load_data(config.data.train, config.data.eval)
    assert len(train) == 24 and all(p.answer for p in train)
    filler = "Let me work through this step by step. " * 8  # past data.max_response_chars
    assert len(filler) > config.response_chars  # the cap's tail path is what the rehearsal's verifier takes
    with MathVerifier(max_chars=config.response_chars) as verifier:
        for problem in train:
            right = verifier.verify(f"{filler}So the answer is \\boxed{{{problem.answer}}}.", problem.answer)
            wrong = verifier.verify(f"{filler}So the answer is \\boxed{{{problem.answer}+1}}.", problem.answer)
            assert right.reward == 1.0, (problem.prompt, problem.answer, right)
            assert wrong.reward == 0.0, (problem.prompt, problem.answer, wrong)
