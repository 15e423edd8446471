"""``models[].generation.weight_sync``: how a model's trainer weights reach its generation replicas,
one registered :class:`~orchestrator.cluster.weight_sync_modes.base.WeightSync` class per module
(``object_store``, ``collective``); a new mode is a module here and its name in ``orchestrator.config.weight_syncs.LAZY``."""
