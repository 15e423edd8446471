"""The learning benchmark's paired comparison and issue #28's target verdict
(benchmarks/paired_report.py), on numbers worked out by hand."""

from __future__ import annotations

import math

import pytest

from benchmarks.paired_report import paired_lines, paired_text, target_verdict

MODELS = ("a", "b")
N8 = {0: 0.30, 1: 0.32, 2: 0.34, 3: 0.30, 4: 0.34}  # mean 0.32, seed sd 0.02
N16 = {s: v + 0.03 for s, v in N8.items()}


def _scores(row: dict[str, dict[int, float]], name: str = "X") -> dict:
    return {"GRPO n=8": {"a": N8, "b": N8}, "GRPO n=16": {"a": N16, "b": N16}, name: row}


def test_paired_differences_are_per_seed_and_read_in_n8_sds():
    row = {"a": {s: v + d for (s, v), d in zip(N8.items(), [0.01, 0.03, 0.05, 0.03, 0.03], strict=True)}, "b": {0: 0.29, 1: 0.33}}
    lines = {(line.method, line.model): line for line in paired_lines(_scores(row), MODELS)}
    a = lines[("X", "a")]
    assert a.mean == pytest.approx(0.03) and a.baseline_sd == pytest.approx(0.02)
    assert a.in_baseline_sds == pytest.approx(1.5) and a.beats_baseline
    assert a.paired_sd == pytest.approx(math.sqrt(0.0008 / 4))  # deviations -.02 0 .02 0 0
    assert a.vs_reference == pytest.approx(0.0) and a.reaches_reference
    b = lines[("X", "b")]  # only the seeds both rows have: 0 and 1
    assert sorted(b.diffs) == [0, 1] and b.mean == pytest.approx(0.0) and not b.beats_baseline
    assert ("GRPO n=8", "a") not in lines and lines[("GRPO n=16", "a")].vs_reference is None


def test_target_needs_both_models_above_one_sd_and_n16_on_one():
    both = {"a": {s: v + 0.03 for s, v in N8.items()}, "b": {s: v + 0.025 for s, v in N8.items()}}
    assert target_verdict(paired_lines(_scores(both), MODELS), MODELS) == "**Target: met** by X."
    # above n=8 by more than 1 sd on both, but below n=16 on both: not met
    below16 = {"a": {s: v + 0.025 for s, v in N8.items()}, "b": {s: v + 0.025 for s, v in N8.items()}}
    assert "not met" in target_verdict(paired_lines(_scores(below16), MODELS), MODELS)
    # one model only: not met, and the closest row is named with its figures
    one = {"a": {s: v + 0.04 for s, v in N8.items()}, "b": dict(N8)}
    verdict = target_verdict(paired_lines(_scores(one), MODELS), MODELS)
    assert "not met" in verdict and "Closest" in verdict and "a +0.040 (+2.0 n=8 sd, +0.010 vs n=16)" in verdict


def test_controls_and_short_rows_are_not_judged():
    good = {"a": {s: v + 0.05 for s, v in N8.items()}, "b": {s: v + 0.05 for s, v in N8.items()}}
    for name in ("GRAFT gate closed", "pool (3 models)", "GRPO n=32"):
        assert "not judged" in target_verdict(paired_lines(_scores(good, name), MODELS), MODELS)
    three = {m: {s: N8[s] + 0.05 for s in (0, 1, 2)} for m in MODELS}
    assert "not judged" in target_verdict(paired_lines(_scores(three), MODELS), MODELS)
    assert "met** by X" in target_verdict(paired_lines(_scores(three), MODELS), MODELS, min_seeds=3)


def test_the_section_lists_every_row_and_ends_with_the_verdict():
    row = {"a": {s: v + 0.01 for s, v in N8.items()}, "b": {s: v - 0.01 for s, v in N8.items()}}
    text = paired_text(_scores(row), MODELS)
    assert "| X | a | 5 | +0.010 | 0.000 | +0.5 | 5/5 | -0.020 | +0.010 +0.010 +0.010 +0.010 +0.010 |" in text
    assert "| X | b | 5 | -0.010 |" in text and text.splitlines()[-1].startswith("**Target: not met**")
    assert paired_text({"X": row}, MODELS) == ""  # no GRPO n=8 row: nothing to pair with
