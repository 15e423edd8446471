"""A trainer rank's and a generation replica's settings: the config's own sections, nothing
copied by hand, nothing swallowed.

Every field a rank or replica reads as configured is declared once, in a section model of the
workers (``workers.training.settings``, ``workers.rollout.settings``) that the config's section
extends; ``orchestrator.cluster.model_actors`` builds the settings from the config's section
objects. These tests set every such field to a value other than its default and check that it
arrives unchanged (a hand copy that forgets one fails here), that every field of the config's
trainer section either reaches the rank or is the driver's, and that a name that is not a
setting is an error naming it, from a policy as from a caller.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from orchestrator.cluster.model_actors import generation_settings, trainer_settings
from orchestrator.config import (
    AlgorithmConfig,
    ExchangeConfig,
    GenerationConfig,
    ModelConfig,
    TrainerConfig,
    load_config,
)
from policies import available_policies, make_policy
from workers.rollout.settings import (
    GenerationSection,
    GenerationSettings,
    ModelSection,
    VLLMSettings,
)
from workers.training.settings import (
    ReceiverSection,
    TrainerSection,
    TrainerSettings,
    UpdateSection,
)

# a value other than the default for every field of the sections a rank or replica receives
CHANGED = {
    ModelSection: {"trust_remote_code": True, "chat_template": "none", "pad_token": "<pad>"},
    TrainerSection: {"lr": 3e-4, "betas": [0.8, 0.9], "weight_decay": 0.0, "grad_clip": 2.0, "grad_accum": 3,
                     "max_tokens_per_micro_batch": 512, "logprob_chunk_tokens": 64, "share_prompts": False,
                     "mmap_threshold_mib": 8, "gradient_checkpointing": True, "grad_parts": False,
                     "precision": "bf16-mixed", "export_dtype": "bfloat16",
                     "deepspeed": {"zero_stage": 3, "bf16": False, "param_persistence_threshold": 0}},
    UpdateSection: {"eps_low": 0.1, "eps_high": 0.3, "minibatches": 2, "minibatch_split": "groups", "epochs": 2,
                    "loss_normalizer": "step", "old_logprobs": "recompute"},
    ReceiverSection: {"delta": 0.5, "gate": False, "gate_scope": "group", "peer_responses": "success",
                      "peer_advantages": "asymmetric", "peer_beta": 0.25, "gate_kind": "per_byte",
                      "peer_placement": "spread", "peer_ratio": "shaped", "shaping_gamma": 0.2},
    GenerationSection: {"backend": "hf", "batch_size": 7, "dtype": "bfloat16", "kv_cache_budget_gb": 2.5},
}
WHERE = {ModelSection: "models.0", TrainerSection: "models.0.trainer", UpdateSection: "algorithm",
         ReceiverSection: "exchange", GenerationSection: "models.0.generation"}

# fields of the config's sections that only the driver reads (resources, placement, the policy):
# a rank or replica gets what is derived from them, or nothing
DRIVER_ONLY = {
    TrainerConfig: {"backend", "workers", "num_cpus", "num_gpus", "num_threads", "resources"},
    AlgorithmConfig: {"n", "prompt_batch"},
    ExchangeConfig: {"name", "params", "routing", "transfer"},
    ModelConfig: {"name", "path", "builder", "placement", "generation", "trainer", "lora"},
    GenerationConfig: {"temperature", "top_p", "max_new_tokens", "replicas", "num_cpus", "num_gpus", "num_threads",
                       "nice", "weight_sync", "sync_bucket_mb", "sync_dtype", "resources", "vllm"},
}


def _changed_config():
    overrides = [f"{WHERE[section]}.{key}={value}" for section, values in CHANGED.items()
                 for key, value in values.items()]
    return load_config("configs/demo_pair.yaml", overrides=overrides)


def _expected(section: type) -> dict:
    return {key: tuple(value) if isinstance(value, list) else value for key, value in CHANGED[section].items()}


def _plain(value):
    """A nested section as the mapping it was set from."""
    return value.model_dump() if isinstance(value, BaseModel) else value


def test_every_field_of_a_section_is_changed_here():
    """The table above covers every field of the sections (a new field gets a value here)."""
    for section, values in CHANGED.items():
        assert set(values) == set(section.model_fields), section.__name__
        defaults = section()
        for key, value in _expected(section).items():
            assert _plain(getattr(defaults, key)) != value or key == "backend", (section.__name__, key)


def test_every_field_of_the_configs_sections_reaches_the_trainer_rank_unchanged():
    config = _changed_config()
    model = config.models[0]
    settings = trainer_settings(model, config.algorithm, config.exchange, seed=5, lora=None,
                                sync_dtype="bfloat16", num_threads=2)
    for section in (ModelSection, TrainerSection, UpdateSection, ReceiverSection):
        for key, value in _expected(section).items():
            assert _plain(getattr(settings, key)) == value, (WHERE[section], key)
    assert (settings.seed, settings.sync_dtype, settings.num_threads, settings.device) == (5, "bfloat16", 2, "cpu")
    assert settings.world_size == model.trainer.workers


def test_every_field_of_the_configs_sections_reaches_the_generation_replica_unchanged():
    config = _changed_config()
    settings = generation_settings(config.models[0], "folder", num_threads=3, nice=4, lora=None)
    for section in (ModelSection, GenerationSection):
        for key, value in _expected(section).items():
            assert _plain(getattr(settings, key)) == value, (WHERE[section], key)
    assert (settings.path, settings.num_threads, settings.nice, settings.device) == ("folder", 3, 4, "cpu")
    assert settings.vllm == config.models[0].generation.vllm.resolved(0)


def test_settings_take_only_their_own_sections_and_derive_no_section_field():
    config = load_config("configs/demo_pair.yaml")
    with pytest.raises(TypeError, match="RunConfig is none of its sections"):
        TrainerSettings.of(config.run)
    with pytest.raises(TypeError, match="lr come from the config's sections"):
        TrainerSettings.of(config.models[0].trainer, lr=1.0)


def test_every_config_field_reaches_the_actors_or_is_the_drivers():
    """A field added to a config section is either one the rank / replica receives (declared in
    its section, so no other edit) or one named here as the driver's."""
    received = {TrainerConfig: TrainerSettings, AlgorithmConfig: TrainerSettings, ExchangeConfig: TrainerSettings,
                ModelConfig: TrainerSettings, GenerationConfig: GenerationSettings}
    for config_section, settings in received.items():
        sections = [base for base in settings.__bases__ if issubclass(config_section, base)]
        from_sections = {key for section in sections for key in section.model_fields}
        assert set(config_section.model_fields) - from_sections == DRIVER_ONLY[config_section], \
            config_section.__name__


def test_the_settings_restate_no_default():
    """A rank's settings record declares no field of its sections again (so no second default)."""
    for settings, sections in ((TrainerSettings, (ModelSection, TrainerSection, UpdateSection, ReceiverSection)),
                               (GenerationSettings, (ModelSection, GenerationSection))):
        own = set(settings.__annotations__)
        for section in sections:
            assert not own & set(section.model_fields), (settings.__name__, section.__name__)
            assert issubclass(settings, section)


def test_a_setting_that_does_not_exist_is_an_error_that_names_it():
    with pytest.raises(TypeError, match="sgt_cof"):
        TrainerSettings().with_changes(sgt_cof=0.2)
    assert TrainerSettings().with_changes(sgt_coef=0.2).sgt_coef == 0.2
    with pytest.raises(ValidationError, match="peer_ratio"):
        TrainerSettings().with_changes(peer_ratio="clipped")


def test_every_policys_trainer_params_are_settings():
    """What a policy asks of the trainer ranks names settings (checked on the driver at start)."""
    needed = {"stored": {"store": "unused", "peers": ["llama-char"]}}  # the one policy with required params
    asked = {name: make_policy(name, **needed.get(name, {})).trainer_params() for name in available_policies()}
    assert asked["sgt"] == {"sgt_coef": 0.1}
    from policies import available_transfers
    from policies.transfer import make_transfer

    by_transfer = {name: make_transfer(name, {}).trainer_params() for name in available_transfers()}
    assert by_transfer["luffy"] == {"peer_ratio": "shaped"}
    for params in [*asked.values(), *by_transfer.values()]:
        TrainerSettings().with_changes(**params)


def test_a_generation_replica_refuses_a_setting_it_does_not_have(paths):
    """A replica's settings are one typed record (``workers.rollout.settings``, no catch-all): vllm's
    engine settings live in their own section, and a misspelled one is named."""
    from workers.rollout.generation import GenerationWorker

    settings = GenerationSettings(path=str(paths["llama-char"]))
    with pytest.raises(TypeError, match="batchsize"):
        settings.with_changes(batchsize=4)
    with pytest.raises(TypeError, match="gpu_memory_utilization"):
        settings.with_changes(gpu_memory_utilization=0.5)
    with pytest.raises(ValidationError, match="gpu_memory"):
        VLLMSettings(gpu_memory=0.5)
    worker = GenerationWorker(settings.with_changes(batch_size=4), "llama-char")
    assert worker.backend.batch_size == 4 and worker.model == "llama-char"
