"""A run whose config sets ``models[].pad_token`` (the documented choice for a Llama-3 tokenizer,
``<|finetune_right_pad_id|>``) keeps it in the run folder's ``config.yaml``: the redaction that
masks credentials in every written config must not take a tokenizer's special token for one, or
``graftpool eval RUN_DIR``, which loads that file, refuses the run's own models. Real tiny
Llama-3-style model and tokenizer, a real evaluation on Ray's local instance."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from graftpool.redaction import MASK, redact_text, register_secrets_in
from orchestrator.cli import evaluate_run
from orchestrator.config import dump_config, load_config
from orchestrator.controller.checkpoint import prepare_run_dir
from tests.llama3_style import RESERVED_PAD, build_llama3_style
from workers.training.trainer import TorchTrainer

DEMO = Path(__file__).resolve().parent.parent / "configs" / "demo_pair.yaml"


def test_a_run_that_sets_pad_token_keeps_it_in_config_yaml_and_evaluates(tmp_path):
    llama3 = build_llama3_style(tmp_path / "llama3")
    data = yaml.safe_load(DEMO.read_text())
    data["models"] = [{"name": name, "path": str(llama3), "pad_token": RESERVED_PAD,
                       "generation": {"max_new_tokens": 4}} for name in ("a", "b")]
    config = load_config(data=data, overrides=[f"run.output_dir={tmp_path / 'runs'}"])
    register_secrets_in(config.model_dump(mode="json"))  # what `train` does before the run starts
    run_dir = tmp_path / "runs" / config.run.name
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(dump_config(config))  # the controller's own writer
    for name in ("a", "b"):  # the final models as the run's export writes them
        TorchTrainer(llama3, pad_token=RESERVED_PAD).export(run_dir / "final" / name)
    scores = evaluate_run(run_dir, ["eval.max_prompts=1", "eval.samples=1"])
    assert set(scores) == {"a", "b"}
    assert json.loads((run_dir / "eval.json").read_text()) == scores
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert [m["pad_token"] for m in saved["models"]] == [RESERVED_PAD, RESERVED_PAD]
    assert redact_text(f"pads with {RESERVED_PAD}") == f"pads with {RESERVED_PAD}"


def test_a_run_folder_written_with_pad_token_masked_still_resumes(tmp_path):
    """Before the fix above, ``config.yaml`` held ``pad_token: '***'``; the same config resumed now
    (its pad token written out) is the same run, not a changed one."""
    llama3 = build_llama3_style(tmp_path / "llama3")
    data = yaml.safe_load(DEMO.read_text())
    data["models"] = [{"name": name, "path": str(llama3), "pad_token": RESERVED_PAD} for name in ("a", "b")]
    config = load_config(data=data, overrides=[f"run.output_dir={tmp_path / 'runs'}", "run.resume=true"])
    run_dir = tmp_path / "runs" / config.run.name
    checkpoint = run_dir / "checkpoints" / "step_000002"
    checkpoint.mkdir(parents=True)
    (checkpoint / "controller.json").write_text('{"step": 2}')
    saved = yaml.safe_load(dump_config(config))
    for model in saved["models"]:
        model["pad_token"] = MASK  # as the earlier writer left it
    (run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert prepare_run_dir(run_dir, config) == checkpoint
