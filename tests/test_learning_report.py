"""The learning benchmark's row metrics, curves, store summaries and rows
(benchmarks/learning_report.py, exchange_analysis.py, learning_methods.py, bench_learning.py),
on numbers worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.learning_report import run_means


def test_row_metrics_are_step_means_of_what_the_run_logged(tmp_path):
    records = [{"event": "start"},
               {"step": 1, "model": "a", "metrics": {"exchange/rate": 0.5, "gate/admission_rate_pos": 0.2}},
               {"step": 2, "model": "a", "metrics": {"exchange/rate": 0.7, "gate/admission_rate_pos": float("nan")}},
               {"step": 1, "model": "b", "metrics": {"exchange/rate": 0.1}}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    got = run_means(tmp_path, "a")
    (tmp_path / "metrics.jsonl").unlink()  # a results copy keeps the digest instead (run_digest.json)
    assert json.dumps(run_means(tmp_path, "a")) == json.dumps(got)  # NaN != NaN: compared as text
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
    summary = json.loads((run / "store_summary.json").read_text())["a"]["tasks"]["count"]  # cached for copies
    assert (summary["offered_correct"], summary["admitted_correct"], summary["offered_wrong"],
            summary["admitted_wrong"]) == (2, 1, 2, 1)
    assert weak["push_ratio"] == pytest.approx((1.35 - 0.5) / (1.35 + 0.5))
    assert weak["donor_correct_over_budget"] == 0.5  # 12 > 10 tokens, 9 fits
    assert weak["own_at_budget"] == 0.5
    assert (weak["admit_correct"], weak["admit_wrong"]) == (0.5, 0.5)
    text = report(tmp_path)
    assert "| graft | 0 |" in text and "-0.20" in text and "0:0.00 10:0.50" in text
    assert "**count** 0.46, 0.50 / 0.50, 0.50, 0.50;" in text
    # a results copy keeps config, summary and the two digests, not the raw files: the same report
    import shutil

    (run / "metrics.jsonl").unlink()
    shutil.rmtree(run / "trajectories")
    assert report(tmp_path) == text


def test_every_benchmark_row_names_a_valid_run_folder():
    """A row's slug names its run (run.name: letters, digits, '_', '-', '.'): 'GRAFT spread+step'
    once stopped the benchmark at that row; a split variant too."""
    from benchmarks.learning_methods import METHODS, TABLE, method
    from orchestrator.config import SAFE_NAME

    slugs = [m.slug for m in METHODS] + [method(name).slug for name in TABLE]
    assert all(SAFE_NAME.match(f"{slug}-s0") for slug in slugs), slugs
    assert len(set(slugs)) == len(slugs) - len([n for n in TABLE if "[" not in n])  # the table's rows are rows
    groups = method("GRAFT [groups]")
    assert groups.slug == "graft-groups" and groups.overrides[-1] == "algorithm.minibatch_split=groups"
    with pytest.raises(ValueError, match="unknown row"):
        method("GRAFT turbo")


def test_quick_runs_the_committed_tables_choice(tmp_path, monkeypatch):
    """``make bench-learning QUICK=1`` runs the configuration the committed premise table chose."""
    import benchmarks.bench_learning as bench

    monkeypatch.setattr(bench, "ROOT", tmp_path)
    table = tmp_path / "table1.json"
    assert bench.committed_choice(table) == (None, f"no committed table at {table}")
    table.write_text(json.dumps({"selection": {"best": None, "ranking": "no exchange configuration ..."}}))
    assert bench.committed_choice(table)[0] is None
    table.write_text(json.dumps({"selection": {"best": "SGT", "ranking": "SGT 0.300, GRAFT 0.100"}}))
    assert bench.committed_choice(table) == ("SGT", "SGT (chosen in table1.json: SGT 0.300, GRAFT 0.100)")


def test_gate_histograms_count_every_value_once_and_the_per_byte_score_by_hand():
    """benchmarks/gate_histograms: ln s on fixed edges [-8, 2] by 0.25 with under / over / missing
    (s = 0 is under, the edge 2 is in the last bin); per byte: (n_B l_B - n_A l_A) / bytes, by hand."""
    from benchmarks.gate_histograms import EDGES, gate_histograms, histogram, log_s, log_s_per_byte

    h = histogram([log_s(0.0), -8.0, -7.9, 1.99, 2.0, 2.5, log_s(None)])
    assert (h["under"], h["over"], h["missing"]) == (1, 1, 1)
    assert h["counts"][0] == 2 and h["counts"][-1] == 2 and sum(h["counts"]) == 4 and len(h["counts"]) == 40
    # l_A = -1 over 4 donor tokens, s = e^-0.5 so l_B = -1.5 over 6 receiver tokens, 3 bytes
    assert log_s_per_byte(math.exp(-0.5), -1.0, 4, 6, "abc") == pytest.approx((6 * -1.5 - 4 * -1.0) / 3)
    assert math.isnan(log_s_per_byte(math.exp(-0.5), -1.0, None, 6, "abc"))  # no donor row: missing
    base = {"step": 1, "prompt_id": "q", "task": "count", "response": "ab", "mean_logp": -1.0}
    rows = [{**base, "model": "b", "kind": "own", "sample": 0, "n_tokens": 2, "reward": 1.0, "source_model": "b",
             "compat": None},
            {**base, "model": "a", "kind": "graft", "sample": 0, "n_tokens": 3, "reward": 1.0, "source_model": "b",
             "compat": 1.0},
            {**base, "model": "a", "kind": "graft", "sample": 1, "n_tokens": 3, "reward": 0.0, "source_model": "b",
             "compat": math.exp(-9)}]
    got = gate_histograms(rows)
    assert got["edges"] == EDGES and list(got["models"]) == ["a"]
    per_token, per_byte = got["models"]["a"]["count"]["log_s"], got["models"]["a"]["count"]["log_s_per_byte"]
    assert per_token["correct"]["counts"][EDGES.index(0.0)] == 1 and per_token["wrong"]["under"] == 1
    assert per_byte["correct"]["counts"][EDGES.index(-0.5)] == 1  # (3 * -1 - 2 * -1) / 2 bytes
    assert per_byte["wrong"]["missing"] == 1  # sample 1 has no donor row here


def test_one_model_tables_reads_one_member_of_a_pool_run(tmp_path):
    """``one_model_tables --members``: a member's curve from a run of the whole pool (its lines
    only, the other members' evaluations at the same steps left out), its weak tasks first."""
    from benchmarks.one_model_tables import curve_table

    run = tmp_path / "grpo-n8-s3"
    run.mkdir()
    lines = [{"event": "start", "time": 0.0}]
    for step in (0, 10):
        for model, hit in (("llama-char", 0.0), ("qwen2-char", 0.5)):
            lines.append({"step": step, "model": model, "metrics": {
                "eval/avg/pass_at_1": 0.2, **{f"eval/{t}/pass_at_1": hit + step / 100
                                              for t in ("count", "digits", "linear", "add", "mod")}}})
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    (run / "summary.json").write_text("{}")
    table = curve_table(run, "llama-char")
    assert table.startswith("**llama-char, seed 3** (grpo-n8-s3") and "weak tasks count, digits" in table
    assert "| 10 | 0.100 | 0.100 |" in table and "0.600" not in table
    assert table.rstrip().endswith("highest on its weak tasks after step 0: 0.100")
