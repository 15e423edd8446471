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
