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
    = ln s; a response with no ``\\boxed{`` has an empty answer span; other rows have NaN."""
    from tests.platform_checks import read_store

    rows = read_store(graft_pair_run)
    grafts = [r for r in rows if r["kind"] == "graft" and r["compat"] is not None and r["compat"] > 0]
    assert len(grafts) >= 8 and any(not r["trained"] for r in grafts), "too few graft rows, or none dropped"
    for r in grafts:
        parts = [r[name] for name in SPLIT_COLUMNS]
        assert not math.isnan(parts[0]) and not math.isnan(parts[1]), r
        assert split_sum(parts) == pytest.approx(math.log(r["compat"]), abs=1e-5), r
        if "\\boxed{" not in r["response"]:
            assert parts[0] == 0.0, r
    boxed = [r for r in grafts if "\\boxed{" in r["response"]]
    assert boxed and any(r["compat_answer"] != 0.0 for r in boxed)
    assert any(not math.isnan(r["compat_eos"]) for r in grafts)
    assert all(math.isnan(r[name]) for r in rows if r["kind"] != "graft" for name in SPLIT_COLUMNS)
