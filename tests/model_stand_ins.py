"""Local stand-ins for a config's real models: a folder holding only ``config.json`` (what the
loader reads to size a model), so that a config naming 1-3 B models loads without their weights."""

from __future__ import annotations

import json
from pathlib import Path


def point_at_stand_ins(models: list[dict], folder: Path, hidden_size: int, layers: int) -> None:
    """Point each model of a config's ``models`` list at ``folder/<name>``, a Qwen2-shaped
    ``config.json`` of ``hidden_size`` and ``layers`` (vocabulary 151,936) and nothing else."""
    for model in models:
        stand_in = folder / model["name"]
        stand_in.mkdir()
        (stand_in / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": hidden_size,
                                                          "num_hidden_layers": layers, "vocab_size": 151936}))
        model["path"] = str(stand_in)
