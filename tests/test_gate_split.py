"""The gate's ln s split into the answer span, the rest and EOS (workers/receiver/gate_split.py,
issue #53 part 2): the equation on hand-made numbers, and the three store columns of a real graft
run summing to its ``compat``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.receiver.gate_split import SPLIT_COLUMNS, side_parts, split_log_s, split_sum


def test_the_split_is_its_equation_on_hand_numbers():
    # B: 5 tokens (2 of reasoning, 2 of the answer span, EOS); A: 4 (1, 2, EOS)
    b = np.array([-1.0, -2.0, -0.5, -0.5, -0.25], dtype=np.float32)
    a = [-0.4, -0.2, -0.2, -0.8]
    parts = split_log_s(b, 2, a, 1, finished=True)
    assert parts.rest == pytest.approx(-3.0 / 5 - (-0.4) / 4)
    assert parts.answer == pytest.approx(-1.0 / 5 - (-0.4) / 4)
    assert parts.eos == pytest.approx(-0.25 / 5 - (-0.8) / 4)
    assert split_sum(parts) == pytest.approx(b.mean() - np.mean(a))  # ln s, Eq. 7
    # cut at the budget: no EOS on either side, the answer span runs to the end
    cut = split_log_s(b, 2, a, 1, finished=False)
    assert math.isnan(cut.eos) and cut.answer == pytest.approx(-1.25 / 5 - (-1.2) / 4)
    assert split_sum(cut) == pytest.approx(b.mean() - np.mean(a))
    # no \boxed{ (the start is every token): all reasoning, the EOS still its own part
    whole = side_parts(b, len(b), finished=True)
    assert whole.answer == 0.0 and whole.rest == pytest.approx(-4.0 / 5)
    # nothing to split: a side with no tokens, no log-probs or no start
    for args in ((b[:0], 0, a, 1), (b, 2, None, 1), (b, 2, a, None)):
        assert all(math.isnan(x) for x in split_log_s(*args, finished=True))


@pytest.mark.slow
def test_a_graft_runs_split_columns_sum_to_its_compat(graft_pair_run):
    """The demo pair's 2-step graft run (token_mean gate, so ``compat`` = s of Eq. 7): on every
    graft row, scored under the receiver's pi_old whether admitted or not, answer + rest + eos
    = ln s; a response with no ``\\boxed{`` has an empty answer span; other rows have none (null,
    so that two equal runs' stores compare equal row by row)."""
    from tests.platform_checks import read_store

    rows = read_store(graft_pair_run)
    grafts = [r for r in rows if r["kind"] == "graft" and r["compat"] is not None and r["compat"] > 0]
    assert len(grafts) >= 8 and any(not r["trained"] for r in grafts), "too few graft rows, or none dropped"
    for r in grafts:
        parts = [r[name] for name in SPLIT_COLUMNS]
        assert parts[0] is not None and parts[1] is not None, r
        assert split_sum(parts) == pytest.approx(math.log(r["compat"]), abs=1e-5), r
        if "\\boxed{" not in r["response"]:
            assert parts[0] == 0.0, r
    boxed = [r for r in grafts if "\\boxed{" in r["response"]]
    assert boxed and any(r["compat_answer"] != 0.0 for r in boxed)
    assert any(r["compat_eos"] is not None for r in grafts)
    assert all(r[name] is None for r in rows if r["kind"] != "graft" for name in SPLIT_COLUMNS)


def test_the_analysis_reads_the_parts_from_a_hand_made_store(tmp_path):
    """benchmarks/gate_split.py on a store written by hand: per receiver and task, each part's
    mean for correct and wrong donor responses and its AUROC."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.gate_split import markdown, read_store, row_parts, table

    nan = float("nan")
    rows = [  # model, task, reward, kind, answer, rest, eos
        ("B", "add", 1.0, "own", nan, nan, nan),
        ("B", "add", 1.0, "graft", -0.9, 0.1, -0.05),  # correct: a low answer, a high rest
        ("B", "add", 1.0, "graft", -0.7, 0.0, nan),  # correct, cut at the budget
        ("B", "add", 0.0, "graft", -0.1, -0.4, -0.02),  # wrong: a high answer, a low rest
        ("B", "add", 0.0, "graft", -0.2, -0.2, -0.06),
        ("B", "add", 0.0, "graft", nan, nan, nan),  # re-tokenised to nothing: left out
        ("A", "mod", 0.0, "graft", -0.3, -0.3, -0.01),  # no correct one: AUROC undefined
    ]
    names = ["model", "task", "reward", "kind", "compat_answer", "compat_rest", "compat_eos"]
    (tmp_path / "run" / "trajectories").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows]),
                   tmp_path / "run" / "trajectories" / "step_000001.parquet")
    result = table({"run": row_parts(read_store(tmp_path / "run"))})["run"]
    add = result["B"]["add"]
    assert (add["n_correct"], add["n_wrong"], add["n_eos"]) == (2, 2, 3)
    assert add["answer"]["mean_correct"] == pytest.approx(-0.8) and add["answer"]["mean_wrong"] == pytest.approx(-0.15)
    assert add["rest"]["mean_correct"] == pytest.approx(0.05) and add["rest"]["mean_wrong"] == pytest.approx(-0.3)
    assert add["eos"]["mean_correct"] == pytest.approx(-0.05) and add["eos"]["mean_wrong"] == pytest.approx(-0.04)
    # ln s per row: -0.85, -0.7 (correct); -0.52, -0.46 (wrong)
    assert add["log_s"]["mean_correct"] == pytest.approx(-0.775) and add["log_s"]["mean_wrong"] == pytest.approx(-0.49)
    assert (add["answer"]["auroc"], add["rest"]["auroc"], add["log_s"]["auroc"]) == (0.0, 1.0, 0.0)
    assert add["eos"]["auroc"] == 0.5  # the one finished correct (-0.05) beats -0.06, not -0.02
    mod = result["A"]["mod"]
    assert (mod["n_correct"], mod["n_wrong"]) == (0, 1) and math.isnan(mod["log_s"]["auroc"])
    assert "| run | B | add | 2 | 2 | 3 |" in markdown({"run": result})
