"""``models[].generation.weight_sync``'s registry: how a model's trainer weights reach its
generation replicas, one registered ``WeightSync`` class per module of
``orchestrator/cluster/weight_sync_modes/`` (``object_store``, ``collective``). It lives here, on
the config's floor, so that the config takes any registered name without importing the cluster
layer (or torch); the modes register into it from above (``weight_sync_modes.base.register_weight_sync``)."""

from __future__ import annotations

from graftpool.registry import Registry

LAZY = {"object_store": "orchestrator.cluster.weight_sync_modes.object_store",
        "collective": "orchestrator.cluster.weight_sync_modes.collective"}
"""The built-in modes: name -> the module that registers it, imported on first lookup."""

WEIGHT_SYNCS: Registry[type] = Registry("weight sync mode", "models[].generation.weight_sync", lazy=LAZY)

KEEPS_WEIGHTS = {"object_store"}
"""The built-in modes that keep the last sync's weights for a replica started again (their
classes' ``keeps_weights``, held equal by ``tests/test_weight_sync_modes.py``), known here so that
``run.async: one_step``'s check at load imports no mode's module (they import torch)."""


def keeps_weights(name: str) -> bool:
    """Whether mode ``name`` keeps the weights its replicas sampled with (what ``run.async:
    one_step`` needs): a built-in's from :data:`KEEPS_WEIGHTS`, a registered plugin's from its class."""
    return name in KEEPS_WEIGHTS if name in LAZY else bool(WEIGHT_SYNCS.get(name).keeps_weights)

