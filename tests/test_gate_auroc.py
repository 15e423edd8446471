"""benchmarks/gate_auroc.py: the gate variants' scores from store rows, and AUROC, by hand."""

import math

import pytest

from benchmarks.gate_auroc import auroc, row_scores, table


def test_auroc_counts_pairs_and_halves_ties():
    assert auroc([3.0, 1.0], [2.0, 0.0]) == 0.75  # 3>2, 3>0, 1>0; 1<2
    assert auroc([1.0], [1.0]) == 0.5
    assert auroc([-math.inf], [0.0]) == 0.0
    assert auroc([float("nan"), 2.0], [1.0]) == 1.0  # NaN scores are left out
    assert math.isnan(auroc([], [1.0]))


def _row(kind, model, source, sample, reward, mean_logp, n_tokens, compat=None, response="12"):
    return {"step": 1, "model": model, "prompt_id": "q", "task": "add", "sample": sample, "response": response,
            "n_tokens": n_tokens, "reward": reward, "source_model": source, "kind": kind, "compat": compat,
            "mean_logp": mean_logp}


def test_each_variant_is_its_formula_and_the_table_splits_by_correctness():
    rows = [
        _row("own", "A", "A", 0, 1.0, -0.5, 4),  # donor A's own responses: n_A 4 and 2 tokens
        _row("own", "A", "A", 1, 0.0, -1.0, 2),
        _row("own", "B", "B", 0, 0.0, -2.0, 3),  # receiver B's own: mean l -2.5
        _row("own", "B", "B", 1, 0.0, -3.0, 3),
        _row("graft", "B", "A", 0, 1.0, -0.5, 5, compat=math.exp(-1.0), response="1234567890"),  # l_B = -1.5
        _row("graft", "B", "A", 1, 0.0, -1.0, 6, compat=math.exp(-0.25), response="wrong"),  # l_B = -1.25
    ]
    right, wrong = row_scores(rows)
    assert right["correct"] and not wrong["correct"]
    assert right["per_token"] == pytest.approx(-1.0)
    assert right["per_byte"] == pytest.approx((5 * -1.5 - 4 * -0.5) / 10)  # 10 bytes
    assert right["self_calibrated"] == pytest.approx(-1.5 - -2.5)
    assert wrong["per_byte"] == pytest.approx((6 * -1.25 - 2 * -1.0) / 5)
    assert wrong["self_calibrated"] == pytest.approx(-1.25 - -2.5)
    result = table([right, wrong])["B"]["add"]
    assert (result["n_correct"], result["n_wrong"]) == (1, 1)
    assert result["per_token"] == 0.0 and result["self_calibrated"] == 0.0  # the wrong one scores higher
    assert result["per_byte"] == 1.0  # -0.55 per byte against -1.1: per byte, the right one


def test_an_answer_masked_runs_compat_is_that_variant_alone():
    rows = [
        _row("own", "B", "B", 0, 0.0, -2.0, 3),
        _row("graft", "B", "A", 0, 1.0, -0.5, 5, compat=math.exp(-0.2)),
        _row("graft", "B", "A", 1, 0.0, -1.0, 6, compat=math.exp(-0.7)),
    ]
    right, wrong = row_scores(rows, "answer_masked")
    assert right["answer_masked"] == pytest.approx(-0.2) and wrong["answer_masked"] == pytest.approx(-0.7)
    assert all(math.isnan(right[v]) for v in ("per_token", "per_byte", "self_calibrated"))
    token_mean = row_scores(rows)
    assert all(math.isnan(r["answer_masked"]) for r in token_mean)
    result = table([right, wrong, *token_mean])["B"]["add"]
    assert result["answer_masked"] == 1.0  # the right one scores higher, on the answer-masked rows alone
    assert (result["n_correct"], result["n_wrong"]) == (1, 1)  # the token_mean run's rows
    assert (result["n_correct_answer_masked"], result["n_wrong_answer_masked"]) == (1, 1)
    with pytest.raises(ValueError, match="per_byte"):
        row_scores(rows, "per_byte")
