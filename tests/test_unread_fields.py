"""A config field its exchange does not read is said at load (issue #51's forty-sixth read, half b).

``configs/gpu/graft_pair_3b.yaml`` sets ``algorithm.eps_low: 0.2``, ``eps_high: 0.28`` and
``exchange.delta: 0.8``; a user who runs it with ``--set exchange.name=hacpo`` trains with HACPO's
``sequence`` objective, whose clip is ``exchange.params.eps_low`` / ``eps_high`` (3e-4 / 4e-4), and
without a gate, so the three fields had no effect, and nothing said so. Real configs, no mocks."""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml

from orchestrator.config import load_config
from tests.model_stand_ins import point_at_stand_ins

ROOT = Path(__file__).resolve().parents[1]
BASE = {"models": [{"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}},
                   {"name": "b", "builder": {"arch": "gpt2", "tokenizer": "bpe"}}]}


def _unread(data: dict, overrides: list[str], trains: bool = True) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(data=data, overrides=overrides, check_backends=False, trains=trains)
    return [str(w.message) for w in caught if "does not read" in str(w.message)]


def test_the_gpu_template_under_hacpo_or_sgt_names_the_fields_that_have_no_effect(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["1+1=?"], "answer": ["2"]}), tmp_path / "math.parquet")
    data = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())
    point_at_stand_ins(data["models"], tmp_path, hidden_size=2048, layers=36)
    for source in [data["data"]["train"], *data["data"]["eval"]]:
        source["path"] = str(tmp_path / "math.parquet")
    assert _unread(data, []) == []  # graft reads them all
    said = _unread(data, ["exchange.name=hacpo"])
    assert len(said) == 1 and said[0].startswith("algorithm.eps_low, algorithm.eps_high, exchange.delta: "), said
    assert "'hacpo'" in said[0] and "exchange.params" in said[0]
    said = _unread(data, ["exchange.name=sgt"])
    assert len(said) == 1 and said[0].startswith("exchange.delta: ") and "'sgt'" in said[0], said


def test_only_what_the_exchange_does_not_read_is_named():
    assert _unread(BASE, ["exchange.name=hacpo"]) == []  # nothing set: nothing to say
    assert _unread(BASE, ["exchange.name=hacpo", "exchange.peer_placement=first"]) == []  # read by its peer rows
    assert _unread(BASE, ["exchange.routing=pair", "exchange.transfer=luffy", "exchange.gate_scope=group", "algorithm.eps_low=0.1"]) == []
    assert _unread(BASE, ["exchange.name=sgt", "algorithm.eps_low=0.1"]) == []  # own rows: the token objective
    said = _unread(BASE, ["exchange.name=sgt", "exchange.peer_ratio=shaped", "exchange.gate=false"])
    assert len(said) == 1 and said[0].startswith("exchange.gate, exchange.peer_ratio: "), said
    said = _unread(BASE, ["exchange.name=hacpo", "algorithm.loss_normalizer=step"])
    assert len(said) == 1 and said[0].startswith("algorithm.loss_normalizer: "), said
    # the routing and transfer spelling of the same exchange
    said = _unread(BASE, ["exchange.routing=every_prompt", "exchange.transfer=hacpo", "exchange.delta=0.5"])
    assert len(said) == 1 and said[0].startswith("exchange.delta: ") and "'every_prompt+hacpo'" in said[0], said
    # an evaluation's run folder config.yaml sets every field: not said there
    assert _unread(BASE, ["exchange.name=hacpo", "exchange.delta=0.5"], trains=False) == []
