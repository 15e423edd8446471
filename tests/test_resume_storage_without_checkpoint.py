"""``--resume`` from ``run.storage`` of a run that holds no checkpoint there, with another config.

The twenty-eighth read made ``prepare_run_dir`` compare a resume's config with the run folder's
whether or not the folder holds a checkpoint. A job re-submitted on a fresh working copy or a new
head has no run folder: ``open_storage`` downloads the latest checkpoint with the config, and for a
run of ``run.checkpoint_every: 0`` there is none, so nothing came down, nothing was compared,
and the resumed job of another config started a new run whose uploads replaced the finished
run's config, store files, summary and final models in storage, which operations.md says is
refused (issue #51's twenty-ninth read). Now the config comes down without a checkpoint too.

A real one-step run with ``run.storage``, then the real resume path from another head's folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config import ConfigError, load_config
from orchestrator.controller.loop import Controller

ROOT = Path(__file__).resolve().parent.parent


def test_a_resume_from_storage_with_another_config_of_a_run_without_checkpoints_is_refused(tmp_path, ray_local):
    config = yaml.safe_load((ROOT / "configs" / "demo_pair.yaml").read_text())
    config["models"], config["exchange"] = config["models"][:1], {"name": "none"}
    config["data"]["verifier_actors"] = 1
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(config, sort_keys=False))  # key order: the zoo cache key
    shared = tmp_path / "shared"
    sets = ["run.steps=1", "run.eval_every=0", "run.name=job", f"run.storage={shared.as_uri()}",
            "run.checkpoint_every=0", "algorithm.prompt_batch=4", "tracking.views=false"]
    Controller(load_config(tmp_path / "job.yaml", [*sets, f"run.output_dir={tmp_path / 'head1'}"])).run()
    stored = {p: p.read_bytes() for p in sorted((shared / "job").rglob("*")) if p.is_file()}
    assert any(p.name == "config.yaml" for p in stored) and not any("checkpoints" in p.parts for p in stored)

    with pytest.raises(ConfigError, match=r"--resume: the config differs .* in models\.0\.trainer\.lr"):
        Controller(load_config(tmp_path / "job.yaml", [*sets, f"run.output_dir={tmp_path / 'head2'}",
                                                        "run.resume=true", "models.0.trainer.lr=1e-3"])).run()
    assert {p: p.read_bytes() for p in sorted((shared / "job").rglob("*")) if p.is_file()} == stored
