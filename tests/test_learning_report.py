"""The learning benchmark's power check and row metrics (benchmarks/learning_report.py),
on numbers worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.learning_report import (
    PowerLine,
    pooled_sd,
    power_check,
    power_text,
    run_means,
    sampling_sd,
)


def _summary(avg: float) -> dict:
    return {"models": {"a": {"final_pass@1": {"avg": avg}}, "b": {"final_pass@1": {"avg": avg + 0.1}}}}


def test_pooled_sd_weights_rows_by_their_degrees_of_freedom():
    # variances 0.01 (3 seeds, 2 dof) and 0.04 (2 seeds, 1 dof): (2 * 0.01 + 0.04) / 3 = 0.02
    rows = [[0.1, 0.2, 0.3], [0.5, 0.5 + math.sqrt(0.08)]]
    assert pooled_sd(rows) == pytest.approx(math.sqrt(0.02))
    assert math.isnan(pooled_sd([[0.3], [0.4]]))


def test_power_needs_a_gain_of_three_pooled_sds_for_every_model():
    n8 = {0: _summary(0.30), 1: _summary(0.32), 2: _summary(0.31)}  # sd 0.01 per row
    n32 = {0: _summary(0.35), 1: _summary(0.37), 2: _summary(0.36)}  # gain 0.05 = 5 sd
    lines = power_check(n8, n32, ("a", "b"), 640, 8)
    assert [line.gain for line in lines] == pytest.approx([0.05, 0.05])
    assert [line.sd for line in lines] == pytest.approx([0.01, 0.01])
    assert all(line.has_power for line in lines) and "HAS power" in power_text(lines)
    weak = power_check(n8, {0: _summary(0.31), 1: _summary(0.33), 2: _summary(0.32)}, ("a", "b"), 640, 8)
    assert not any(line.has_power for line in weak) and "has NO power" in power_text(weak)


def test_one_seed_falls_back_to_the_sampling_sd_and_says_so():
    lines = power_check({0: _summary(0.30)}, {0: _summary(0.40)}, ("a",), 640, 8)
    assert lines[0].sd == pytest.approx(sampling_sd(0.35, 640, 8)) == pytest.approx(math.sqrt(0.35 * 0.65 / 5120))
    assert lines[0].sd_kind == "sampling" and "sampling sd" in power_text(lines)
    assert PowerLine("x", 0.3, 0.3, 0.0, "seed").has_power is False


def test_row_metrics_are_step_means_of_what_the_run_logged(tmp_path):
    records = [{"event": "start"},
               {"step": 1, "model": "a", "metrics": {"exchange/rate": 0.5, "gate/admission_rate_pos": 0.2}},
               {"step": 2, "model": "a", "metrics": {"exchange/rate": 0.7, "gate/admission_rate_pos": float("nan")}},
               {"step": 1, "model": "b", "metrics": {"exchange/rate": 0.1}}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    got = run_means(tmp_path, "a")
    assert got["exchange_rate"] == pytest.approx(0.6)
    assert got["admit_pos"] == pytest.approx(0.2)  # NaN steps (nothing offered) are left out
    assert math.isnan(got["peer_clip"])


def test_eval_curves_and_weak_tasks_come_from_the_run_folder(tmp_path):
    from benchmarks.learning_report import eval_curves, weak_tasks

    records = [{"step": 0, "model": "a", "metrics": {"eval/add/pass_at_1": 0.5, "eval/avg/pass_at_1": 0.4}},
               {"step": 1, "model": "a", "metrics": {"train/loss": 0.1}},
               {"step": 10, "model": "a", "metrics": {"eval/add/pass_at_1": 0.75}},
               {"step": 10, "model": "b", "metrics": {"eval/add/pass_at_1": 0.0}}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    assert eval_curves(tmp_path, "a") == {"add": [(0, 0.5), (10, 0.75)], "avg": [(0, 0.4)]}
    (tmp_path / "config.yaml").write_text("models:\n  - {name: a, builder: {sft_slips: {count: 0.95, digits: 0.95}}}\n"
                                          "  - {name: b, path: /m}\n")
    assert weak_tasks(tmp_path) == {"a": ["count", "digits"], "b": []}


def test_first_seen_all_fail_reads_each_prompts_first_group(tmp_path):
    """q1 fails at step 1 and is solved at step 2 (counts); q2 is solved first (does not);
    q3 fails under model a but a's peer rows and model b do not matter."""
    from benchmarks.learning_report import first_seen_all_fail
    from orchestrator.controller.trajectory_store import SCHEMA, TrajectoryStore

    def rows(step, model, prompt, rewards, kind="own"):
        base = dict.fromkeys(SCHEMA.names)
        return [{**base, "step": step, "model": model, "prompt_id": prompt, "kind": kind, "sample": i,
                 "reward": float(r), "source_model": model, "trained": True} for i, r in enumerate(rewards)]

    store = TrajectoryStore(tmp_path / "trajectories")
    store.write_step(1, rows(1, "a", "q1", [0, 0]) + rows(1, "a", "q2", [1, 0]) + rows(1, "b", "q2", [0, 0])
                     + rows(1, "a", "q3", [1, 1], kind="graft"))
    store.write_step(2, rows(2, "a", "q1", [1, 1]) + rows(2, "a", "q2", [0, 0]) + rows(2, "a", "q3", [0, 0]))
    assert first_seen_all_fail(tmp_path, "a") == ["q1", "q3"]
    assert first_seen_all_fail(tmp_path, "b") == ["q2"]


def test_hypotheses_report_reads_push_budget_and_curves(tmp_path):
    """benchmarks/exchange_analysis on a hand-made run folder: the weak task's push ratio and its
    budget shares are recomputed from the store's rows, the curve from metrics.jsonl."""
    from benchmarks.exchange_analysis import report, run_figures
    from orchestrator.controller.trajectory_store import SCHEMA, TrajectoryStore

    run = tmp_path / "runs" / "graft-s0"
    run.mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "config.yaml").write_text("models:\n  - {name: a, builder: {sft_slips: {count: 0.95}},"
                                     " generation: {max_new_tokens: 10}}\n")
    records = [{"step": 0, "model": "a", "metrics": {"eval/count/pass_at_1": 0.0}},
               {"step": 1, "model": "a", "metrics": {"exchange/peer_push_ratio": -0.2, "train/updates_peer": 1.0}},
               {"step": 10, "model": "a", "metrics": {"eval/count/pass_at_1": 0.5}}]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    base = dict.fromkeys(SCHEMA.names)

    def row(kind, reward, advantage, weight, trained, tokens):
        return {**base, "step": 1, "model": "a", "prompt_id": "q", "task": "count", "kind": kind, "sample": 0,
                "reward": reward, "advantage": advantage, "weight": weight, "trained": trained, "n_tokens": tokens}

    TrajectoryStore(run / "trajectories").write_step(1, [
        row("graft", 1.0, 1.5, 0.9, True, 12), row("graft", 0.0, -0.5, 1.0, True, 8),
        row("graft", 0.0, -0.5, 0.0, False, 8), row("graft", 1.0, 1.5, 0.0, False, 9),
        row("own", 0.0, 0.0, 1.0, False, 10), row("own", 0.0, 0.0, 1.0, False, 4)])
    weak = run_figures(run)["a"]["weak"]["count"]
    assert weak["push_ratio"] == pytest.approx((1.35 - 0.5) / (1.35 + 0.5))
    assert weak["donor_correct_over_budget"] == 0.5  # 12 > 10 tokens, 9 fits
    assert weak["own_at_budget"] == 0.5
    text = report(tmp_path)
    assert "| graft | 0 |" in text and "-0.20" in text and "0:0.00 10:0.50" in text


def test_every_benchmark_row_names_a_valid_run_folder():
    """A row's slug names its run (run.name: letters, digits, '_', '-', '.'): 'GRAFT spread+step'
    once stopped the benchmark at that row."""
    from benchmarks.bench_learning import METHODS
    from orchestrator.config import SAFE_NAME

    slugs = [m.slug for m in METHODS]
    assert all(SAFE_NAME.match(f"{slug}-s0") for slug in slugs), slugs
    assert len(set(slugs)) == len(slugs)


def test_quick_takes_the_best_exchange_row_with_enough_seeds(tmp_path):
    """``make bench-learning QUICK=1`` runs the committed experiments' best exchange row: the
    highest mean final avg over seeds and models, among rows that train peer data (the GRPO rows
    and the gate-closed control are not exchanges), with at least two seeds."""
    from benchmarks.bench_learning import best_exchange

    def row(*avgs):
        return {model: {str(s): {"final": {"avg": a}} for s, a in enumerate(avgs)} for model in ("a", "b")}

    table = tmp_path / "table1.json"
    table.write_text(json.dumps({"rows": {"GRPO n=8": row(0.9, 0.9), "GRAFT gate closed": row(0.8, 0.8),
                                          "GRAFT": row(0.2, 0.3), "GRAFT spread": row(0.4, 0.2),
                                          "GRAFT LUFFY": row(0.7)}}))
    best, why = best_exchange(table)
    assert best == "GRAFT spread" and "GRAFT spread 0.300, GRAFT 0.250" in why
    assert best_exchange(table, min_seeds=1)[0] == "GRAFT LUFFY"
    assert best_exchange(tmp_path / "missing.json") == (None, f"no committed experiments at {tmp_path / 'missing.json'}")
