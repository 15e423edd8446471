"""The premise check and the learning benchmark's report (benchmarks/premise_check.py,
learning_tables.py) on hand-made run folders: which figures each reads and what it decides."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.learning_methods import method
from benchmarks.premise_check import peer_solves, premise_lines, premise_text, weak_score

CONFIG = ("models:\n  - {name: llama-char, builder: {sft_slips: {count: 1.0, digits: 1.0}}}\n"
          "  - {name: gpt2-bpe, builder: {sft_slips: {add: 1.0, linear: 1.0}}}\n")
SETS = ("add", "count", "digits", "linear")


def _run(folder: Path, curves: dict[str, dict[int, dict[str, float]]]) -> Path:
    """A run folder: config, metrics.jsonl with the eval curves, summary.json with the last ones."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(CONFIG)
    records = [{"step": step, "model": model, "metrics": {f"eval/{k}/pass_at_1": v for k, v in scores.items()}}
               for model, by_step in curves.items() for step, scores in by_step.items()]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    finals = {m: {**by_step[max(by_step)], "avg": sum(by_step[max(by_step)].values()) / len(SETS)}
              for m, by_step in curves.items()}
    (folder / "summary.json").write_text(json.dumps({"models": {m: {"final_pass@1": f, "best_pass@1": f}
                                                                for m, f in finals.items()}}))
    return folder


def _scores(llama_weak: float, gpt2_weak: float, donor: float = 0.5) -> dict[str, dict[str, float]]:
    return {"llama-char": {"add": donor, "linear": donor, "count": llama_weak, "digits": llama_weak},
            "gpt2-bpe": {"count": donor, "digits": donor, "add": gpt2_weak, "linear": gpt2_weak}}


def _curves(start, middle, end) -> dict[str, dict[int, dict[str, float]]]:
    return {m: {0: start[m], 40: middle[m], 80: end[m]} for m in start}


def test_weak_score_is_the_mean_over_the_weak_tasks_sets():
    assert weak_score({"count": 0.1, "digits": 0.3, "add": 0.9}, ["count", "digits"]) == pytest.approx(0.2)
    assert weak_score({"add": 0.9}, ["count"]) != weak_score({"add": 0.9}, ["count"])  # NaN: not evaluated


def test_premise_holds_only_when_n32_stays_near_zero_at_every_evaluation(tmp_path):
    flat = _curves(_scores(0.0, 0.0), _scores(0.01, 0.02), _scores(0.02, 0.0))
    healing = _curves(_scores(0.0, 0.0), _scores(0.08, 0.0), _scores(0.04, 0.0))  # above 0.05 at step 40 only
    n8 = {s: _run(tmp_path / f"n8-s{s}", flat) for s in (0, 1)}
    n32 = {0: _run(tmp_path / "n32-s0", flat), 1: _run(tmp_path / "n32-s1", healing)}
    lines = {(line.seed, line.model): line for line in premise_lines(n8, n32)}
    assert lines[0, "llama-char"].cannot_heal and peer_solves([lines[0, "llama-char"]])
    assert lines[0, "llama-char"].donor == "gpt2-bpe"
    assert lines[0, "llama-char"].donor_start == {"count": 0.5, "digits": 0.5}
    assert lines[0, "llama-char"].n32 == pytest.approx(0.02) and lines[0, "gpt2-bpe"].n32_max == pytest.approx(0.02)
    assert not lines[1, "llama-char"].cannot_heal and lines[1, "llama-char"].n32_max == pytest.approx(0.08)
    text = premise_text(list(lines.values()), {"llama-char": [0.02, 0.02]}, {"llama-char": [0.3, 0.32]})
    assert "**Verdict: the premise does NOT hold** on seeds [0, 1] (GRPO n=32 lifts a weak task" in text
    weak_donor = _curves(_scores(0.0, 0.0, donor=0.25), _scores(0.0, 0.0), _scores(0.0, 0.0))
    lines = premise_lines({0: _run(tmp_path / "n8b", weak_donor)}, {0: _run(tmp_path / "n32b", weak_donor)})
    assert not peer_solves(lines)
    assert "a donor is below 0.3 on a weak task at step 0 (mean over seeds)" in premise_text(lines, {}, {})
    # the donor judged on its mean over seeds: 0.29 on one seed and 0.33 on another pass (0.31)
    near = {s: _run(tmp_path / f"n8c-s{s}", _curves(_scores(0.0, 0.0, donor=d), _scores(0.0, 0.0), _scores(0.0, 0.0)))
            for s, d in ((0, 0.29), (1, 0.33))}
    lines = premise_lines(near, near)
    assert peer_solves(lines) and "(for llama-char) 0.310" in premise_text(lines, {}, {})


def test_report_pairs_rows_selects_the_best_and_confirms(tmp_path):
    """Two exchange rows on seeds 0-1 (selection) and the chosen one on seed 2 (confirmation):
    the report's premise, rows, paired sections, choice and confirmation, and table1.json."""
    from benchmarks.learning_tables import report

    runs = tmp_path / "runs"
    base = _scores(0.0, 0.0)
    for seed in (0, 1, 2):
        for name, weak in (("GRPO n=8", 0.0), ("GRPO n=32", 0.01), ("GRAFT", 0.1 + 0.1 * seed), ("SGT", 0.05)):
            if name == "SGT" and seed == 2:
                continue
            _run(runs / f"{method(name).slug}-s{seed}", _curves(base, base, _scores(weak, weak)))
    args = argparse.Namespace(seeds=[0, 1], confirm_seeds=[2], out=tmp_path,
                              pair_config=Path("learning_premise.yaml"), pool_config=Path("pool.yaml"))
    rows = [method(n) for n in ("GRPO n=8", "GRPO n=32", "GRAFT", "SGT")]
    text, best = report(args, runs, rows, "## Premise check ...")
    assert best == "GRAFT" and "Ranking: GRAFT 0.150, SGT 0.050" in text
    assert "| GRAFT | llama-char | 2 | 0.150 ± 0.071 |" in text  # weak-task pass@1 on seeds 0 and 1
    assert "### Primary: weak-task pass@1 at the horizon: paired by seed against GRPO n=8" in text
    assert "## Confirmation on fresh seeds [2]: GRAFT" in text
    assert "| llama-char | +0.290 | yes |" in text  # 0.30 - 0.01 on seed 2
    saved = json.loads((tmp_path / "table1.json").read_text())
    assert saved["selection"]["best"] == "GRAFT" and saved["confirmation"]["weak_margin"]["gpt2-bpe"]["2"] == \
        pytest.approx(0.29)
    assert (tmp_path / "table1.png").is_file() and (tmp_path / "task_curves.png").is_file()


POOL_WEAK = {"llama-char": ("count", "digits"), "qwen2-char": ("count", "linear"),
             "gpt2-bpe-dl": ("digits", "linear"), "llama-bpe": ("digits", "linear")}
"""configs/learning_premise_pool.yaml's weak sets: a triangle over count, digits and linear with
{digits, linear} twice, so every receiver's two weak tasks have different donors."""


def _pool_run(folder: Path, weak: dict[str, tuple[str, ...]], start: dict[str, dict[str, float]],
              weak_level: float = 0.01) -> Path:
    """A 4-model run folder whose models start at ``start`` and whose weak tasks stay at ``weak_level``."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("models:\n" + "".join(
        f"  - {{name: {m}, builder: {{sft_slips: {{{', '.join(f'{t}: 1.0' for t in tasks)}}}}}}}\n"
        for m, tasks in weak.items()))
    later = {m: {t: weak_level if t in weak[m] else v for t, v in scores.items()} for m, scores in start.items()}
    records = [{"step": step, "model": m, "metrics": {f"eval/{t}/pass_at_1": v for t, v in scores[m].items()}}
               for step, scores in ((0, start), (40, later), (80, later)) for m in weak]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    finals = {m: {**scores, "avg": sum(scores.values()) / len(scores)} for m, scores in later.items()}
    (folder / "summary.json").write_text(json.dumps({"models": {m: {"final_pass@1": f, "best_pass@1": f}
                                                                for m, f in finals.items()}}))
    return folder


def _pool_start(weak: dict[str, tuple[str, ...]]) -> dict[str, dict[str, float]]:
    """Step-0 pass@1: 0 on a model's weak tasks, 0.5 on the others."""
    return {m: {t: 0.0 if t in tasks else 0.5 for t in ("add", "count", "digits", "linear")} for m, tasks in weak.items()}


def test_pool_premise_names_each_weak_tasks_donors(tmp_path):
    """Four models whose weak sets meet pairwise (configs/learning_premise_pool.yaml's): every weak
    task has its donors among the peers, no single peer donates both of a receiver's weak tasks,
    and the premise holds."""
    from benchmarks.premise_check import single_donors, task_donors

    runs = {s: _pool_run(tmp_path / f"s{s}", POOL_WEAK, _pool_start(POOL_WEAK)) for s in (0, 1)}
    lines = premise_lines(runs, runs)
    assert len(lines) == 8 and all(line.cannot_heal for line in lines)
    donors = task_donors(lines)
    assert donors["llama-char", "count"] == ["gpt2-bpe-dl", "llama-bpe"]
    assert donors["llama-char", "digits"] == ["qwen2-char"]
    assert donors["gpt2-bpe-dl", "linear"] == ["llama-char"] and donors["llama-bpe", "digits"] == ["qwen2-char"]
    assert single_donors(lines) == {m: [] for m in POOL_WEAK}
    text = premise_text(lines, {}, {})
    assert "| llama-char | count | gpt2-bpe-dl, llama-bpe | qwen2-char 0.000 gpt2-bpe-dl 0.500 llama-bpe 0.500 | no |" \
        in text
    assert "**Verdict: the premise HOLDS** on seeds [0, 1]." in text


def test_pool_premise_fails_when_one_peer_donates_all_of_a_receivers_weak_tasks(tmp_path):
    """Every weak task has a donor and none heals, but llama-bpe, weak on add and digits, is strong
    on both of qwen2-char's (count, linear) and qwen2-char on both of its: each of them would need
    one donor only, and the check says so."""
    covering = {**POOL_WEAK, "llama-bpe": ("add", "digits")}
    runs = {0: _pool_run(tmp_path / "covering", covering, _pool_start(covering))}
    lines = premise_lines(runs, runs)
    assert peer_solves(lines) and all(line.cannot_heal for line in lines)
    assert "**Verdict: the premise does NOT hold** on seeds [0] (one peer donates all of qwen2-char's weak tasks " \
        "(llama-bpe); one peer donates all of llama-bpe's weak tasks (qwen2-char))." in premise_text(lines, {}, {})


def test_pool_premise_needs_a_donor_for_every_weak_task(tmp_path):
    """A task weak for every member (a star, not a triangle) has no donor: the check says so."""
    star = {"llama-char": ("count", "digits"), "qwen2-char": ("count", "linear"),
            "gpt2-bpe-dl": ("add", "count"), "llama-bpe": ("count", "digits")}
    from benchmarks.premise_check import task_donors

    runs = {0: _pool_run(tmp_path / "star", star, _pool_start(star))}
    lines = premise_lines(runs, runs)
    assert task_donors(lines)["llama-char", "count"] == [] and not peer_solves(lines)
    assert "| qwen2-char | count | none |" in premise_text(lines, {}, {})


POOL_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "learning_premise_pool.yaml"


def test_learning_premise_pool_needs_two_donors_for_every_member():
    """configs/learning_premise_pool.yaml loads, and its design holds on its own fields: four
    members, distinct styles and architecture-tokenizer pairs, every weak set two tasks that each
    have a peer without it (a donor to be), and every two weak sets meet (no peer free of both of a
    receiver's weak tasks)."""
    from orchestrator.config import load_config

    models = load_config(POOL_CONFIG).models
    weak = {m.name: set(m.builder.sft_slips) for m in models}
    assert {m: tuple(sorted(t)) for m, t in weak.items()} == {m: tuple(sorted(t)) for m, t in POOL_WEAK.items()}
    assert len({m.builder.solution_style for m in models}) == 4
    assert len({(m.builder.arch, m.builder.tokenizer) for m in models}) == 4
    assert all(m.builder.slip == "result" and set(m.builder.sft_slips.values()) == {1.0} for m in models)
    for model, tasks in weak.items():
        peers = [p for p in weak if p != model]
        assert all(any(task not in weak[p] for p in peers) for task in tasks)
        assert all(weak[p] & tasks for p in peers)


def test_bench_learning_config_runs_the_rows_on_a_pools_models(tmp_path):
    """``--config``: the rows name the pool's four models; the report has each of them in its
    rows and its paired sections, the pool's ``pool: <transfer>`` rows are the exchange
    configurations it compares and selects from (issue #52: its paired section was empty and its
    selection 'rows missing' for them), and the confirmation reads the four models."""
    from benchmarks.bench_learning import regime_rows
    from benchmarks.learning_tables import report

    rows = regime_rows([method(n) for n in ("GRPO n=8", "GRPO n=32", "pool: sgt", "pool: graft")], POOL_CONFIG)
    assert [r.models for r in rows] == [tuple(POOL_WEAK)] * 4 and rows[0].slug == method("GRPO n=8").slug
    runs = tmp_path / "runs"
    weak = {"pool: sgt": (0.06, 0.11, 0.2), "pool: graft": (0.02, 0.02)}  # per seed; the GRPO rows at 0.01
    for row in rows:
        for seed, level in enumerate(weak.get(row.name, (0.01, 0.01, 0.01))):
            _pool_run(runs / f"{row.slug}-s{seed}", POOL_WEAK, _pool_start(POOL_WEAK), weak_level=level)
    args = argparse.Namespace(seeds=[0, 1], confirm_seeds=[2], out=tmp_path, pair_config=POOL_CONFIG,
                              pool_config=POOL_CONFIG)
    text, best = report(args, runs, rows, "## Premise check ...")
    assert "# Table 1 in learning_premise_pool.yaml" in text
    for model in POOL_WEAK:
        assert f"| GRPO n=8 | {model} | 2 | 0.010 ± 0.000 |" in text
        assert f"| GRPO n=32 | {model} | 2 | +0.000 |" in text  # paired against GRPO n=8
        assert f"| pool: sgt | {model} | 2 | +0.075 |" in text and f"| pool: graft | {model} | 2 | +0.010 |" in text
        assert f"| {model} | +0.190 | yes |" in text  # seed 2: 0.20 - GRPO n=32's 0.01
    assert best == "pool: sgt" and "the seeds [0, 1] and the 4 models" in text
    assert "Ranking: pool: sgt 0.085, pool: graft 0.020" in text
    assert "## Confirmation on fresh seeds [2]: pool: sgt" in text and "Holm p (4 models)" in text


def test_each_member_of_the_pool_is_compared_with_its_best_pair(tmp_path):
    """Issue #52's second target: ``pair: <a> + <b> SGT`` rows train two of the regime's models
    alone (the config's other models dropped); each member's best pair is the pair row with its
    highest weak-task pass@1 over the selection seeds, and the report pairs the chosen pool row
    against it per member (Holm over the members). Pair rows are not pool configurations: the
    selection still needs every member."""
    from benchmarks.bench_learning import members_only, regime_rows
    from benchmarks.learning_tables import report

    pairs = {"pair: llama-char + qwen2-char SGT": 0.05, "pair: llama-char + gpt2-bpe-dl SGT": 0.12,
             "pair: qwen2-char + llama-bpe SGT": 0.03, "pair: gpt2-bpe-dl + llama-bpe SGT": 0.04}
    rows = regime_rows([method(n) for n in ("GRPO n=8", "pool: sgt", *pairs)], POOL_CONFIG)
    assert rows[2].models == ("llama-char", "qwen2-char") and rows[2].overrides == ("exchange.name=sgt",)
    assert [m["name"] for m in members_only(POOL_CONFIG, ("llama-bpe", "qwen2-char"))["models"]] == \
        ["qwen2-char", "llama-bpe"]
    with pytest.raises(SystemExit, match="gpt2-bpe: not a model of learning_premise_pool.yaml"):
        members_only(POOL_CONFIG, ("llama-char", "gpt2-bpe"))
    runs = tmp_path / "runs"
    for row in rows:
        weak = {m: POOL_WEAK[m] for m in row.models}
        for seed in (0, 1):
            level = {"GRPO n=8": 0.01, "pool: sgt": 0.10}.get(row.name) or pairs[row.name]
            _pool_run(runs / f"{row.slug}-s{seed}", weak, _pool_start(weak), weak_level=level)
    args = argparse.Namespace(seeds=[0, 1], confirm_seeds=[], out=tmp_path, pair_config=POOL_CONFIG,
                              pool_config=POOL_CONFIG)
    text, best = report(args, runs, rows, "")
    assert best == "pool: sgt" and "## pool: sgt against each member's best pair" in text
    assert "| llama-char | pair: llama-char + gpt2-bpe-dl SGT | 0.120 | 2 | -0.020 |" in text
    assert "| qwen2-char | pair: llama-char + qwen2-char SGT | 0.050 | 2 | +0.050 |" in text
    assert "| llama-bpe | pair: gpt2-bpe-dl + llama-bpe SGT | 0.040 | 2 | +0.060 |" in text
    assert "**no** (llama-char, gpt2-bpe-dl)" in text
    _, best = report(args, runs, rows[2:3], "")  # a pair row alone: no pool configuration to choose
    assert best is None


def test_the_premise_check_of_a_regime_reads_that_regimes_models(tmp_path):
    """``bench_learning --config`` (issue #52's pool): the premise rows carry the regime's models,
    and the check reads their scores, not the pair's (it stopped with ``KeyError: 'gpt2-bpe'``
    after both GRPO runs of the 4-model pool had trained)."""
    from benchmarks.bench_learning import premise_holds, regime_rows, run_dir

    root = Path(__file__).resolve().parent.parent
    rows = regime_rows([method("GRPO n=8"), method("GRPO n=32")], root / "configs" / "learning_premise_pool.yaml")
    names = rows[0].models
    assert set(names) == {"llama-char", "qwen2-char", "gpt2-bpe-dl", "llama-bpe"}
    config = "models:\n" + "".join(f"  - {{name: {m}, builder: {{sft_slips: {{count: 1.0}}}}}}\n" for m in names)
    scores = {m: {"count": 0.0 if i else 0.5, "add": 0.5} for i, m in enumerate(names)}
    runs = tmp_path / "runs"
    for row in rows:
        folder = _run(run_dir(row, 0, runs), _curves(scores, scores, scores))
        (folder / "config.yaml").write_text(config)
    holds, text = premise_holds(runs, rows, [0])
    assert all(m in text for m in names) and "gpt2-bpe " not in text
