"""The final model's dtype (``models[].trainer.export_dtype``, ``workers/model_export.py``), on
the demo pair's real tiny models: a bf16-mixed trainer exports bf16 files (``auto``: the
compute dtype), half the bytes of fp32's, holding its fp32 masters rounded to bf16, which
everything that loads an export loads; ``float32`` exports the masters as they are; checkpoints
keep the fp32 masters; an fp32 trainer's export is what ``save_pretrained`` always wrote, byte
for byte (the demo's evaluations load it). The deepspeed backend's export is covered in
``tests/test_scale_deepspeed.py``."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from orchestrator.config import ConfigError, load_config
from workers.rollout.generation import HFGeneration, SamplingParams
from workers.training.trainer import TorchTrainer

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "configs" / "demo_pair.yaml"
LORA = {"r": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": None, "init_seed": 0}


def data_bytes(folder: Path) -> int:
    """The tensor bytes of ``folder``'s safetensors file: its size less the 8-byte header length
    and the JSON header."""
    path = folder / "model.safetensors"
    with path.open("rb") as f:
        (header,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - header


def written(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The export's tensors and the dtype its config.json names."""
    return load_file(str(folder / "model.safetensors")), json.loads((folder / "config.json").read_text())["dtype"]


def test_a_bf16_mixed_trainer_exports_its_masters_in_bf16_and_checkpoints_keep_fp32(paths, tmp_path):
    trainer = TorchTrainer(paths["llama-char"], precision="bf16-mixed", seed=0)
    masters = trainer.state_dict()
    assert {v.dtype for v in masters.values()} == {torch.float32}
    trainer.export(tmp_path / "bf16")
    tensors, dtype = written(tmp_path / "bf16")
    assert dtype == "bfloat16" and {v.dtype for v in tensors.values()} == {torch.bfloat16}
    for name, value in tensors.items():
        assert torch.equal(value, masters[name].to(torch.bfloat16)), name
    assert any(not torch.equal(masters[k].to(torch.bfloat16).float(), masters[k]) for k in tensors)  # it rounded

    trainer.settings = trainer.settings.with_changes(export_dtype="float32")
    trainer.export(tmp_path / "fp32")
    tensors32, dtype32 = written(tmp_path / "fp32")
    assert dtype32 == "float32" and tensors32.keys() == tensors.keys()
    assert all(torch.equal(value, masters[name]) for name, value in tensors32.items())
    assert 2 * data_bytes(tmp_path / "bf16") == data_bytes(tmp_path / "fp32")

    trainer.save(tmp_path / "ckpt")  # resume keeps the fp32 masters
    kept = torch.load(tmp_path / "ckpt" / "trainer_rank0.pt", weights_only=False)["model"]
    assert all(torch.equal(kept[k], v) for k, v in masters.items())

    # what loads an export: transformers (dtype auto: bf16), an hf replica (eval, serve) in its own
    # dtype, a trainer (a later run warm-started from it) in its precision's
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "bf16")).dtype == torch.bfloat16
    replica = HFGeneration(tmp_path / "bf16")
    assert {p.dtype for p in replica.model.parameters()} == {torch.float32}
    torch.manual_seed(0)
    assert replica.generate(["12+35="], SamplingParams(n=2, max_new_tokens=8))[0].responses
    again = TorchTrainer(tmp_path / "bf16", precision="bf16-mixed", seed=0).state_dict()
    assert all(torch.equal(again[k], v.float()) for k, v in tensors.items())


def test_an_fp32_trainer_exports_what_save_pretrained_wrote(paths, tmp_path):
    """CPU's default precision (auto: fp32): the same files, byte for byte, as before the setting."""
    trainer = TorchTrainer(paths["gpt2-bpe"], seed=0)
    trainer.export(tmp_path / "export")
    trainer.model.save_pretrained(str(tmp_path / "plain"))
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "export" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), name


def test_a_bf16_mixed_lora_export_is_the_merged_model_in_bf16(paths, tmp_path):
    trainer = TorchTrainer(paths["gpt2-bpe"], precision="bf16-mixed", lora=LORA, seed=0)
    trainer.export(tmp_path / "final")
    tensors, dtype = written(tmp_path / "final")
    assert dtype == "bfloat16" and {v.dtype for v in tensors.values() if v.is_floating_point()} == {torch.bfloat16}
    assert not any(".lora_" in k or "base_layer" in k for k in tensors)
    assert (tmp_path / "final" / "adapter" / "adapter_model.safetensors").exists()


def test_export_dtype_is_a_trainer_setting_of_the_config():
    config = load_config(DEMO, ["models.0.trainer.export_dtype=bfloat16"])
    assert config.models[0].trainer.export_dtype == "bfloat16" and config.models[1].trainer.export_dtype == "auto"
    with pytest.raises(ConfigError, match="export_dtype"):
        load_config(DEMO, ["models.0.trainer.export_dtype=float16"])


@pytest.mark.parametrize(("precision", "sync_dtype"), [("fp32", "float32"), ("bf16-mixed", "bfloat16")])
def test_a_tied_models_weight_sync_holds_its_head_and_embedding_as_one_host_tensor(tmp_path, precision, sync_dtype):
    """Issue #51's twenty-fourth read: a weight sync copied every state-dict entry to the host on
    its own, so a tied LM head (Qwen2.5-3B's and Llama-3.2-3B's) went to the replicas as a second
    copy of the embedding (0.6-0.8 GB more a sync in bf16 at 3 B, computed). Now one host tensor
    holds both names, as the model does (``workers.model_export.host_copies``), in the sync dtype."""
    from tests.llama3_style import build_llama3_style

    trainer = TorchTrainer(build_llama3_style(tmp_path / "tied"), precision=precision, seed=0,
                           sync_dtype=sync_dtype)
    weights = trainer.weights_for_sync()
    assert weights is not None and weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    assert weights["lm_head.weight"].dtype == getattr(torch, sync_dtype) and weights["lm_head.weight"].device.type == "cpu"
    live = trainer.model.get_input_embeddings().weight
    assert weights["lm_head.weight"].data_ptr() != live.data_ptr()  # a copy, not the live weight (fp32: cloned)
    assert torch.equal(weights["lm_head.weight"], live.detach().to(weights["lm_head.weight"].dtype))
