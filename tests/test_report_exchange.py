"""``dashboards report`` / ``compare`` name a run's exchange and share its flow as the run's routing
moved it (issue #51's forty-seventh read, half b).

A run folder copied back from a cluster without its MLflow store is reported from its own
``config.yaml`` and ``metrics.jsonl`` (``dashboards.data.from_run_dir``). Two figures of that report
were wrong for exchanges that config.md documents:

- a config that gives ``exchange.routing`` / ``exchange.transfer`` (``exchange.name: null``) was
  reported as exchange policy "None";
- under ``exchange.name: hacpo`` (``every_prompt`` routing: every model's group on every prompt goes
  to every other model) the "who fed whom" list gave each pair's groups as a share of the receiver's
  all-fail groups, which passes 100% (HACPO moves the groups of every prompt, not only the all-fail ones).

Real configs (``load_config``, ``dump_config``), a real run folder's files, the real report code."""

from __future__ import annotations

import json
import re
from pathlib import Path

from dashboards.data import from_run_dir
from dashboards.report import render_compare, who_fed_whom
from orchestrator.config import load_config
from orchestrator.config.loading import dump_config

BASE = {"models": [{"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}},
                   {"name": "b", "builder": {"arch": "gpt2", "tokenizer": "bpe"}}],
        "algorithm": {"prompt_batch": 16}}


def _run_folder(folder: Path, overrides: list[str], from_b: float, all_fail_rate: float = 0.25) -> Path:
    """A run folder as a two-step job leaves it: its config.yaml and its metrics.jsonl, where
    model a received ``from_b`` groups from b at each step with ``all_fail_rate`` of its 16 prompts
    all-fail (b received nothing)."""
    folder.mkdir()
    (folder / "config.yaml").write_text(dump_config(load_config(data=BASE, overrides=overrides,
                                                                check_backends=False)))
    lines = [{"event": "start"}]
    for step in (1, 2):
        lines += [{"step": step, "model": "a", "metrics": {"train/reward_mean": 0.5, "exchange/from/b": from_b,
                                                             "exchange/all_fail_rate": all_fail_rate}},
                  {"step": step, "model": "b", "metrics": {"train/reward_mean": 0.5, "exchange/from/a": 0.0,
                                                             "exchange/all_fail_rate": 0.0}}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def test_a_routing_and_transfer_run_is_reported_by_its_exchange_not_none(tmp_path):
    run = from_run_dir(_run_folder(tmp_path / "pool-sgt", ["exchange.routing=pool", "exchange.transfer=sgt"], 1.0))
    cells = re.findall(r"<td class=\"l\">([^<]*)</td>", render_compare([run]).split("<h2>")[0])
    assert "pool+sgt" in cells and "None" not in cells, cells
    graft = from_run_dir(_run_folder(tmp_path / "graft", ["exchange.name=graft"], 1.0))
    assert "graft" in re.findall(r"<td class=\"l\">([^<]*)</td>", render_compare([graft]).split("<h2>")[0])


def test_hacpos_flow_is_not_given_as_a_share_of_the_all_fail_groups(tmp_path):
    # HACPO: a's 16 prompts each got b's group, at both steps; 4 of them all-fail each step
    hacpo = who_fed_whom(from_run_dir(_run_folder(tmp_path / "hacpo", ["exchange.name=hacpo"], 16.0)))
    assert "<b>b</b> &rarr; <b>a</b>: 32 groups</li>" in hacpo and "all-fail groups)" not in hacpo, hacpo
    assert "every_prompt" in hacpo
    # GRAFT moves groups to all-fail prompts only: 2 of a's 8 all-fail groups
    graft = who_fed_whom(from_run_dir(_run_folder(tmp_path / "graft", ["exchange.name=graft"], 1.0)))
    assert "<b>b</b> &rarr; <b>a</b>: 2 groups (25% of a's 8 all-fail groups)</li>" in graft, graft
