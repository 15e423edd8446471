"""A GPU trainer that forms whole-vocabulary logits is warned about at load unless it has a token
budget (issue #51's second read). DeepSpeed ZeRO-3 runs its engine's whole causal-LM forward
(``workers.training.logprobs._hf_model``), so without ``trainer.max_tokens_per_micro_batch`` a
scoring forward of 256 rows x 4,096 new tokens x a 151,936-token vocabulary holds a 593.5 GiB fp32
log-softmax: what ``configs/gpu/graft_pair_3b.yaml`` asked for. No vLLM or DeepSpeed needed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import yaml

from orchestrator.config import load_config
from tests.model_stand_ins import point_at_stand_ins

ROOT = Path(__file__).resolve().parents[1]


def _said(data: dict, overrides: list[str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(data=data, overrides=overrides, check_backends=False)
    return [str(w.message) for w in caught if "whole-vocabulary logits" in str(w.message)]


def _folder(tmp_path: Path, name: str = "qwen") -> Path:
    """A Qwen2.5-3B-sized config.json (no weights: loading a config reads none)."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 2048,
                                                    "num_hidden_layers": 36, "vocab_size": 151936}))
    return folder


def test_a_zero3_trainer_on_a_gpu_without_a_token_budget_is_warned_about(tmp_path):
    data = {"models": [{"name": "qwen", "path": str(_folder(tmp_path)),
                        "generation": {"num_gpus": 1, "max_new_tokens": 4096},
                        "trainer": {"backend": "deepspeed", "num_gpus": 1, "deepspeed": {"zero_stage": 3}}}],
            "algorithm": {"n": 8, "prompt_batch": 128}, "exchange": {"name": "pool"}}
    said = _said(data, [])
    assert len(said) == 1 and said[0].startswith("models.0 (qwen)")
    assert "593.5 GiB" in said[0] and "models.0.trainer.max_tokens_per_micro_batch" in said[0]
    assert _said(data, ["models.0.trainer.max_tokens_per_micro_batch=5120"]) == []
    assert _said(data, ["models.0.trainer.deepspeed.zero_stage=2"]) == []  # the chunked LM head
    assert _said(data, ["models.0.trainer.backend=torch"]) == []
    assert len(_said(data, ["models.0.trainer.backend=torch", "models.0.trainer.logprob_chunk_tokens=null"])) == 1
    assert _said(data, ["models.0.trainer.num_gpus=0"]) == []  # CPU: the toy-budget warning's business


def test_the_gpu_template_sets_a_token_budget_and_gradient_checkpointing(tmp_path):
    """``configs/gpu/graft_pair_3b.yaml`` (ZeRO-3, 4,096 new tokens) with its cluster paths pointed
    at local stand-ins loads without the warning."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"problem": ["1+1=?"], "answer": ["2"]}), tmp_path / "math.parquet")
    data = yaml.safe_load((ROOT / "configs" / "gpu" / "graft_pair_3b.yaml").read_text())
    for model in data["models"]:
        model["path"] = str(_folder(tmp_path, model["name"]))
    data["data"]["train"]["path"] = str(tmp_path / "math.parquet")
    for item in data["data"]["eval"]:
        item["path"] = str(tmp_path / "math.parquet")
    assert _said(data, []) == []
    config = load_config(data=data, check_backends=False)
    for model in config.models:
        assert model.trainer.deepspeed.zero_stage == 3 and model.trainer.gradient_checkpointing
        assert model.trainer.max_tokens_per_micro_batch <= model.generation.vllm.max_model_len


def _update_said(data: dict, overrides: list[str]) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_config(data=data, overrides=overrides, check_backends=False)
    return [str(w.message) for w in caught if "each update's forward" in str(w.message)]


def test_a_gpu_trainer_without_a_token_budget_is_warned_about_its_update_forward(tmp_path):
    """Issue #51's twelfth read: the torch trainer's chunked LM head forms no whole-vocabulary
    logits, but without ``trainer.max_tokens_per_micro_batch`` each update's forward takes a
    rank's whole share of a minibatch with every layer's activations kept: README's own-models
    snippet on GPUs (defaults: 128 prompts x n 8 / 4 minibatches = 256 rows of up to 1,024 new
    tokens) for a 1.5 B model, about 3.4 MiB a token, hundreds of GiB. Said at load."""
    folder = tmp_path / "qwen-1.5b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 1536,
                                                    "num_hidden_layers": 28, "vocab_size": 151936}))
    data = {"models": [{"name": "model-a", "path": str(folder),
                        "generation": {"num_gpus": 1, "max_new_tokens": 1024}, "trainer": {"num_gpus": 1}}],
            "exchange": {"name": "pool"}}
    said = _update_said(data, [])
    assert len(said) == 1 and said[0].startswith("models.0 (model-a)"), said
    assert "256 rows" in said[0] and "262,144 response tokens" in said[0]
    assert "models.0.trainer.max_tokens_per_micro_batch" in said[0] and "gradient_checkpointing" in said[0]
    assert len(_update_said(data, ["models.0.trainer.workers=2"])) == 1 and "128 rows" in \
        _update_said(data, ["models.0.trainer.workers=2"])[0]
    assert _update_said(data, ["models.0.trainer.max_tokens_per_micro_batch=4096"]) == []
    assert _update_said(data, ["models.0.trainer.num_gpus=0"]) == []  # CPU: the toy-budget warning's business
    # ZeRO-3 is named once, by the whole-vocabulary warning
    zero3 = ["models.0.trainer.backend=deepspeed", "models.0.trainer.deepspeed.zero_stage=3"]
    assert _update_said(data, zero3) == [] and len(_said(data, zero3)) == 1
    # a zoo model (built in code, tiny) is not
    zoo = {**data, "models": [{"name": "zoo", "builder": {"arch": "llama", "tokenizer": "char"},
                               "generation": {"num_gpus": 0.25}, "trainer": {"num_gpus": 0.25}}]}
    assert _update_said(zoo, []) == []


def test_the_readmes_own_models_snippet_puts_each_model_on_a_gpu_with_a_token_budget(tmp_path):
    """README's "Your own models and data" YAML, its paths pointed at local stand-ins of 1.5 B
    models (config.json only), loads with no budget warning: both models on a GPU with a real
    budget of new tokens, their trainers under a token budget with gradient checkpointing (model-a
    had none, so its first update held 256 rows' activations; model-b ran on the CPU defaults)."""
    import re

    text = (ROOT / "README.md").read_text()
    section = text[text.index("**3. Your own models and data.**"):]
    data = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    point_at_stand_ins(data["models"], tmp_path, hidden_size=1536, layers=28)
    (tmp_path / "rows.jsonl").write_text('{"problem": "1+1=?", "answer": "2"}\n')
    for source in [data["data"]["train"], *data["data"]["eval"]]:
        source["path"] = str(tmp_path / "rows.jsonl")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = load_config(data=data, check_backends=False)
    assert [str(w.message) for w in caught if str(w.message).startswith("models.")] == []
    assert len(config.models) == 2
    for model in config.models:
        assert model.generation.num_gpus >= 1 and model.trainer.num_gpus >= 1 and model.generation.max_new_tokens > 64
        assert model.trainer.max_tokens_per_micro_batch is not None and model.trainer.gradient_checkpointing
