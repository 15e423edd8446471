"""The learning benchmark's statistics (benchmarks/paired_report.py, issue #41) on numbers worked
out by hand: the paired t with its interval, the exact Wilcoxon signed-rank p, Holm's correction,
the minimum detectable effect, the pre-registered selection and the confirmation's verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.paired_report import (
    PairedTest,
    confirm,
    confirmation_text,
    holm,
    min_detectable_effect,
    paired_lines,
    paired_table,
    select_best,
    wilcoxon_exact,
)

MODELS = ("a", "b")


def _t4_cdf(t: float) -> float:
    """Student's t CDF with 4 degrees of freedom in closed form:
    1/2 + (3/8) u (1 - t^2 / (12 (1 + t^2/4))), u = t / sqrt(1 + t^2/4)."""
    u = t / math.sqrt(1 + t * t / 4)
    return 0.5 + 3 / 8 * u * (1 - t * t / (12 * (1 + t * t / 4)))


def test_paired_t_interval_and_effect_size_by_hand():
    test = PairedTest((0.1, 0.2, 0.3, 0.4, 0.5))
    # mean 0.3; squared deviations .04 .01 0 .01 .04 -> variance 0.1 / 4 = 0.025
    assert test.mean == pytest.approx(0.3) and test.sd == pytest.approx(math.sqrt(0.025))
    se = math.sqrt(0.025) / math.sqrt(5)
    assert test.t == pytest.approx(0.3 / se) == pytest.approx(4.2426407)
    assert test.p_t == pytest.approx(2 * (1 - _t4_cdf(0.3 / se)), rel=1e-9)  # 0.01324
    half = 2.7764451 * se  # t_{0.975, 4} from a table
    low, high = test.interval
    assert low == pytest.approx(0.3 - half, abs=1e-6) and high == pytest.approx(0.3 + half, abs=1e-6)
    assert test.d_z == pytest.approx(0.3 / math.sqrt(0.025))


def test_wilcoxon_exact_counts_sign_assignments():
    # every difference positive: W+ = 15 is the largest of the 32 sums, and 0 the smallest: 2/32
    assert wilcoxon_exact([0.1, 0.2, 0.3, 0.4, 0.5]) == pytest.approx(2 / 32)
    # W+ = 1 + 3 + 4 + 5 = 13, |13 - 7.5| = 5.5: sums >= 13 ({12345} {2345} {1345}) or <= 2 ({} {1} {2})
    assert wilcoxon_exact([0.1, -0.2, 0.3, 0.4, 0.5]) == pytest.approx(6 / 32)
    assert wilcoxon_exact([0.0, 0.2, 0.3]) == pytest.approx(2 / 4)  # the zero is dropped: 2 values, 4 sums
    assert wilcoxon_exact([0.0, 0.0]) == 1.0


def test_holm_steps_down_and_keeps_order():
    # sorted .01 .03 .04 -> 3 x .01 = .03, 2 x .03 = .06, max(.06, 1 x .04) = .06
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adjusted = holm([0.02, float("nan"), 0.01])  # a NaN is not counted in m
    assert adjusted[0] == pytest.approx(0.02) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.02)
    assert holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])


def test_min_detectable_effect_has_the_stated_power():
    """Simulated: differences ~ N(MDE, 1) on 5 seeds reject in 80% of the tries at 0.05."""
    mde = min_detectable_effect(1.0, 5)
    assert 1.5 < mde < 2.0
    rng = np.random.default_rng(0)
    draws = rng.normal(mde, 1.0, size=(40_000, 5))
    t = draws.mean(1) / (draws.std(1, ddof=1) / math.sqrt(5))
    assert np.mean(np.abs(t) > 2.7764451) == pytest.approx(0.80, abs=0.01)
    assert min_detectable_effect(0.02, 5) == pytest.approx(0.02 * mde)


N8 = {0: 0.30, 1: 0.32, 2: 0.34, 3: 0.30, 4: 0.34}
N32 = {s: v + 0.05 for s, v in N8.items()}


def test_paired_lines_use_shared_seeds_and_correct_across_configurations():
    scores = {"GRPO n=8": {"a": N8}, "GRPO n=32": {"a": N32},
              "X": {"a": {s: v + d for (s, v), d in zip(N8.items(), [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)}},
              "Y": {"a": {0: 0.31, 1: 0.33}},  # seeds 0 and 1 only: d = .01 .01
              "GRAFT gate closed": {"a": {s: v - 0.1 for s, v in N8.items()}}}
    lines = {line.method: line for line in paired_lines(scores, ("a",))}
    assert lines["X"].test.diffs == pytest.approx((0.1, 0.2, 0.3, 0.4, 0.5))
    assert lines["X"].vs_ceiling == pytest.approx(0.25)
    assert lines["Y"].test.k == 2 and lines["Y"].test.sd == 0.0 and lines["Y"].test.p_t == 0.0
    # Holm over the two exchange configurations, Y (p 0, times 2) then X (p .0132, times 1): the
    # control is not in the family
    assert lines["Y"].p_holm == 0.0 and lines["X"].p_holm == pytest.approx(0.0132356, rel=1e-4)
    assert math.isnan(lines["GRAFT gate closed"].p_holm) and math.isnan(lines["GRPO n=32"].p_holm)
    table = paired_table(scores, ("a",), "5-set average")
    assert "| X | a | 5 | +0.300 | [+0.104, +0.496] |" in table


def test_selection_is_the_highest_primary_mean_over_models_and_seeds():
    primary = {"GRPO n=32": {"a": {0: 0.9}, "b": {0: 0.9}},  # not an exchange configuration
               "P": {"a": {0: 0.2, 1: 0.4}, "b": {0: 0.1, 1: 0.1}},  # (0.3 + 0.1) / 2 = 0.2
               "Q": {"a": {0: 0.1, 1: 0.1}, "b": {0: 0.25, 1: 0.25}},  # 0.175
               "R": {"a": {0: 0.9}, "b": {0: 0.9}}}  # lacks seed 1
    best, ranking = select_best(primary, MODELS, [0, 1])
    assert best == "P" and ranking == "P 0.200, Q 0.175"


def test_confirmation_needs_every_seed_above_n32_and_a_significant_average():
    seeds = [5, 6, 7, 8, 9]
    weak_n32 = {s: 0.02 for s in seeds}
    primary = {"GRPO n=32": {"a": weak_n32, "b": weak_n32},
               "B": {"a": {s: 0.30 for s in seeds}, "b": {5: 0.3, 6: 0.3, 7: 0.01, 8: 0.3, 9: 0.3}}}
    base = {s: 0.30 + 0.01 * i for i, s in enumerate(seeds)}
    average = {"GRPO n=8": {"a": base, "b": base},
               "B": {"a": {s: v + d for (s, v), d in zip(base.items(), [0.1, 0.2, 0.3, 0.4, 0.5], strict=True)},
                     "b": {s: v + d for (s, v), d in zip(base.items(), [0.1, -0.2, 0.3, 0.4, 0.5], strict=True)}}}
    c = confirm("B", primary, average, MODELS, seeds)
    assert c.weak_margin["b"][7] == pytest.approx(-0.01) and not c.above_ceiling_everywhere
    assert c.p_holm["a"] == pytest.approx(2 * 0.0132356, rel=1e-4)  # the smaller of the two p, times 2
    assert c.p_holm["b"] > 0.05 and not c.average_significant and not c.met
    assert "**Target: not met**" in confirmation_text(c)
    primary["B"]["b"][7] = 0.3
    average["B"]["b"] = average["B"]["a"]
    c = confirm("B", primary, average, MODELS, seeds)
    assert c.above_ceiling_everywhere and c.average_significant and c.met
    assert "**Target: met**" in confirmation_text(c)
