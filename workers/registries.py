"""The worker registries a config names an entry of, declared here without their implementations.

Each built-in entry is a lazy one (``graftpool.registry.Registry``): its name is known here and
its module, which imports torch, registers it on the first lookup. So the config checks these
fields against the registry itself (``graftpool.sections.registered``) without importing torch,
and a name registered by a plugin or a test is a name the config accepts.

| registry | config field | registered by |
|---|---|---|
| :data:`TRAINERS` | ``models[].trainer.backend`` | ``workers.training.trainer`` (torch), ``.deepspeed_trainer`` |
| :data:`BACKENDS` | ``models[].generation.backend`` | ``workers.rollout.generation`` (hf), ``.vllm_generation`` |
| :data:`PRECISIONS` | ``models[].trainer.precision`` | ``workers.precision`` |
| :data:`LOSS_NORMALIZERS` | ``algorithm.loss_normalizer`` | ``workers.receiver.objective`` |
| :data:`PEER_RATIOS` | ``exchange.peer_ratio`` | ``workers.receiver.objective`` |
"""

from __future__ import annotations

from typing import Any

from graftpool.registry import Registry

TRAINING = "workers.training.trainer"
OBJECTIVE = "workers.receiver.objective"
RANKS = "the trainer ranks"  # the actors that look up the update's parts (graftpool.registry's in_actors)

TRAINERS: Registry[type] = Registry("backend", "models[].trainer.backend", lazy={
    "torch": TRAINING, "deepspeed": "workers.training.deepspeed_trainer"})
"""name -> the trainer backend's class (a ``TorchTrainer`` subclass)."""

BACKENDS: Registry[Any] = Registry("backend", "models[].generation.backend", lazy={
    "hf": "workers.rollout.generation", "vllm": "workers.rollout.vllm_generation"},
    in_actors="the generation replicas")
"""name -> the generation backend's factory, which takes the replica's ``GenerationSettings``."""

PRECISIONS: Registry[Any] = Registry("precision", "models[].trainer.precision", lazy=dict.fromkeys(
    ("fp32", "bf16-mixed", "bf16"), "workers.precision"), in_actors=RANKS)
"""name -> ``workers.precision.Precision`` (``auto`` is not one: it resolves to one)."""

LOSS_NORMALIZERS: Registry[Any] = Registry("loss normalizer", "algorithm.loss_normalizer", lazy=dict.fromkeys(
    ("minibatch", "step"), OBJECTIVE), in_actors=RANKS)
"""name -> ``workers.receiver.objective.LossNormalizer``."""

PEER_RATIOS: Registry[Any] = Registry("peer ratio", "exchange.peer_ratio", lazy=dict.fromkeys(
    ("clip", "shaped"), OBJECTIVE), in_actors=RANKS)
"""name -> ``workers.receiver.objective.PeerSurrogate``."""
