"""The step benchmark's arithmetic and report (benchmarks/step_sweep.py, benchmarks/bench_step.py),
on numbers worked out by hand: nothing here runs a model or times anything."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.bench_step import parse_args, report
from benchmarks.step_runs import SIDES, forced_length_model, timed_steps
from benchmarks.step_sweep import (
    Shape,
    fit_exponent,
    fits,
    micro_batch_rows,
    sweep_lines,
    trainer_rss_bound,
)


def test_fit_exponent_recovers_a_power_law_and_needs_two_lengths():
    xs = [16, 64, 256, 1024]
    assert fit_exponent(xs, [3.0 * x**1.5 for x in xs]) == pytest.approx(1.5)
    assert fit_exponent(xs, [7.0] * 4) == pytest.approx(0.0)
    assert fit_exponent([16], [1.0]) is None
    assert fit_exponent([16, 16], [1.0, 2.0]) is None


def test_micro_batch_rows_is_the_largest_power_of_two_within_the_budget():
    assert micro_batch_rows(63, 16384) == 128  # 128 x 63 = 8064
    assert micro_batch_rows(303, 16384) == 32  # 54 would fit; 32 is the largest power of two
    assert micro_batch_rows(1071, 16384) == 8
    assert micro_batch_rows(20000, 16384) == 1  # a row over the budget still runs, alone


def test_trainer_rss_bound_adds_states_activations_and_masks():
    shape = Shape(params=1_000_000, hidden=512, layers=4, vocab=40)
    fp32 = trainer_rss_bound(1000.0, shape, budget_tokens=8192, row_tokens=64, precision="fp32")
    mib = 2**20
    assert fp32["states"] == pytest.approx(12e6 / mib)
    assert fp32["activations"] == pytest.approx(8192 * 4 * 512 * (32 * 4 + 4) / mib)
    assert fp32["masks"] == pytest.approx(4 * 4 * 8192 * 64 / mib)
    assert fp32["bound"] == pytest.approx(sum(v for k, v in fp32.items() if k != "bound"))
    mixed = trainer_rss_bound(1000.0, shape, 8192, 64, "bf16-mixed")
    assert mixed["states"] - fp32["states"] == pytest.approx(2e6 / mib)


def test_forced_length_model_masks_eos_and_allows_the_positions(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (model / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    (model / "model.safetensors").write_bytes(b"weights")
    out = forced_length_model(model, 1024, 47, tmp_path / "work")
    assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": 2, "min_new_tokens": 1024}
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 1071
    assert (out / "model.safetensors").resolve() == (model / "model.safetensors").resolve()


def _run(seconds: float, trainer: float = 900.0) -> dict:
    return {"median_s": seconds, "completion_tokens": 2048.0, "params": 440_000,
            "phases": {"generate": seconds / 2, "train": seconds / 2},
            "peak_rss_mib": {"small/trainer0": trainer, "small/generation0": 500.0}}


def test_report_has_one_comparison_table_and_the_sweep_verdicts():
    args = parse_args([])
    assert args.precisions == ["fp32", "bf16"] and args.lengths == [16, 64, 256, 1024]
    assert args.sweep_steps == [3, 3, 2, 1] and args.trl_max_length == 256
    assert parse_args(["--lengths", "16", "64", "--sweep-steps", "2"]).sweep_steps == [2, 2]
    with pytest.raises(SystemExit):
        parse_args(["--lengths", "16", "64", "--sweep-steps", "2", "3", "4"])
    trl = {"median_s": 2.0, "completion_tokens": 2048.0, "params": 440_000, "peak_rss_mib": 1000.0,
           "phases": {"generate": 1.0, "reward": 0.0, "train": 1.0}}
    comparison = {"small": {s.key: (_run(1.0) if s.framework == "graftpool" else trl) for s in SIDES}}
    rows = {}
    for n, gp_s, trl_s in ((16, 1.0, 2.0), (64, 2.0, 8.0)):
        gp = _run(gp_s) | {"trainer_bound_mib": {"bound": 1000.0}, "trainer_within_bound": True}
        rows[n] = {"steps": 3, "prompt_tokens": 47, "micro_batch_rows": 128, "row_tokens": 47 + n, "graftpool": gp,
                   "trl": trl | {"median_s": trl_s}}
    sweep = {"size": "small", "params": 440_000, "numerics": "fp32", "token_budget": 16384,
             "sides": {"graftpool": "graftpool-fp32", "trl": "trl-fp32"},
             "lengths": rows, "fits": fits(rows, "small/trainer0", "small/generation0")}
    assert sweep["fits"]["exponents"]["graftpool_time"] == pytest.approx(0.5)
    assert sweep["fits"]["exponents"]["trl_time"] == pytest.approx(1.0)
    assert sweep["fits"]["graftpool_grows_no_faster"] is True
    marginal = sweep["fits"]["marginal_s_per_1k_tokens"]
    assert marginal["graftpool"] == pytest.approx(1000 / 48) and marginal["trl"] == pytest.approx(6000 / 48)
    text = report({"when": "today", "machine": "2 CPUs", "command": "c", "comparison": comparison, "sweep": sweep})
    table = [line for line in text.splitlines() if line.startswith("| ") and "M |" in line]
    assert len(table) == len(SIDES)
    assert "0.50x" in text  # GraftPool 1.0 s against every TRL row's 2.0 s
    assert "grows no faster than TRL's (k on the shared lengths): **yes**" in text
    assert "at every length: **yes**" in text and "from 16 to 64: GraftPool 20.833, TRL 125.000" in text
    assert not math.isnan(sweep["fits"]["exponents"]["graftpool_trainer_rss"])
    assert "\n".join(sweep_lines(sweep)).count("| 16 | 3 | 128 x 63 |") == 1


def test_bf16_rows_of_the_large_model_are_skipped_only_where_bf16_is_emulated(monkeypatch):
    """Without AVX512-BF16 / AMX (and no GPU) the large model's bf16 rows are not run, and the
    report says why; the small model's always run, and ``--bf16-everywhere`` runs them all."""
    import benchmarks.bench_step as bench_step

    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(bench_step, "cpu_bf16_flags", lambda: [])
    why = bench_step.bf16_rows_skipped("large", forced=False)
    assert why is not None and "avx512_bf16" in why and "--bf16-everywhere" in why
    assert bench_step.bf16_rows_skipped("small", forced=False) is None
    assert bench_step.bf16_rows_skipped("large", forced=True) is None
    assert parse_args(["--bf16-everywhere"]).bf16_everywhere and not parse_args([]).bf16_everywhere
    monkeypatch.setattr(bench_step, "cpu_bf16_flags", lambda: ["amx_bf16", "amx_tile", "avx512_bf16"])
    assert bench_step.bf16_rows_skipped("large", forced=False) is None
    text = report({"when": "today", "machine": "2 CPUs", "command": "c", "comparison": {"large": {}},
                   "bf16_skipped": {"large": why}})
    assert f"- large, bf16 rows: {why}" in text


def test_timed_steps_leave_out_the_first_step_and_the_untimed_tail():
    steps = list(range(1, 12))  # a run of N + 1 = 11 steps
    assert steps[timed_steps(11)] == list(range(2, 12))
    assert steps[timed_steps(11, untimed_tail=1)] == list(range(2, 11))  # bench-async: 2..N, N + 1 untimed
    assert [1][timed_steps(1)] == [1]
    for bad in ((3, 2), (11, -1), (1, 1)):
        with pytest.raises(ValueError, match="untimed_tail"):
            timed_steps(*bad)
