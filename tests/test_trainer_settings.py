"""A trainer rank's settings: one typed record built from the config, and nothing swallowed.

``orchestrator.cluster.model_actors.trainer_settings`` used to be 26 keyword arguments copied by
hand; these tests check that every setting with a config counterpart is copied from it (a setting
added to the record and forgotten in the copy fails here), that the record's defaults are the
config's defaults, and that a name that is not a setting is an error naming it, from a policy
as from a caller.
"""

from __future__ import annotations

from dataclasses import fields

import pytest

from orchestrator.cluster.model_actors import trainer_settings
from orchestrator.config import AlgorithmConfig, ExchangeConfig, TrainerConfig, load_config
from policies import available_policies, make_policy
from workers.training.settings import TrainerSettings

# settings that no config field of the same name sets: where each one comes from instead
DERIVED = {
    "num_threads": "threads_for(the model's CPUs, ranks, trainer.num_threads)",
    "world_size": "trainer.workers",
    "device": "trainer.num_gpus",
    "lora": "models[].lora plus the init seed",
    "sync_dtype": "the generation replicas' dtype",
    "seed": "the model's seed",
    "sgt_coef": "the sgt policy's trainer_params",
    "kind_modules": "the transfer's own row kinds (policies.transfer.Transfer.kind_modules)",
    "overlapped": "run.async is one_step",
    "trust_remote_code": "models[].trust_remote_code",
    "chat_template": "models[].chat_template",
    "pad_token": "models[].pad_token",
}


def _sections() -> dict[str, dict]:
    return {"trainer": TrainerConfig.model_fields, "algorithm": AlgorithmConfig.model_fields,
            "exchange": ExchangeConfig.model_fields}


def test_every_setting_has_a_source_and_the_configs_defaults():
    sections = _sections()
    defaults = TrainerSettings()
    for field in fields(TrainerSettings):
        owners = [name for name, section in sections.items() if field.name in section]
        assert owners or field.name in DERIVED, f"{field.name}: no config field and no derivation"
        for owner in [] if field.name in DERIVED else owners:
            config_default = sections[owner][field.name].default
            assert getattr(defaults, field.name) == config_default, (field.name, owner)


def test_the_configs_values_reach_the_settings():
    """Every configurable setting set to a non-default value in YAML arrives in the record."""
    changed = {"trainer": {"lr": 3e-4, "betas": [0.8, 0.9], "weight_decay": 0.0, "grad_clip": 2.0, "grad_accum": 3,
                           "max_tokens_per_micro_batch": 512, "logprob_chunk_tokens": 64, "share_prompts": False,
                           "precision": "bf16-mixed", "workers": 2, "mmap_threshold_mib": 8},
               "algorithm": {"eps_low": 0.1, "eps_high": 0.3, "minibatches": 2, "epochs": 2,
                             "loss_normalizer": "step", "old_logprobs": "recompute"},
               "exchange": {"delta": 0.5, "gate": False, "gate_scope": "group", "peer_responses": "success",
                            "peer_advantages": "asymmetric", "peer_beta": 0.25, "peer_placement": "spread",
                            "peer_ratio": "shaped", "shaping_gamma": 0.2}}
    overrides = [f"models.0.trainer.{k}={v}" for k, v in changed["trainer"].items()]
    overrides += [f"{section}.{k}={v}" for section in ("algorithm", "exchange") for k, v in changed[section].items()]
    config = load_config("configs/demo_pair.yaml", overrides=overrides)
    model = config.models[0]
    settings = trainer_settings(model, config.algorithm, config.exchange, seed=5, lora=None,
                                sync_dtype="bfloat16", num_threads=2)
    for section, values in changed.items():
        for key, value in values.items():
            if key == "workers":
                assert settings.world_size == value
            else:
                expected = tuple(value) if isinstance(value, list) else value
                assert getattr(settings, key) == expected, (section, key)
    assert (settings.seed, settings.sync_dtype, settings.num_threads, settings.device) == (5, "bfloat16", 2, "cpu")


def test_a_setting_that_does_not_exist_is_an_error_that_names_it():
    with pytest.raises(TypeError, match="sgt_cof"):
        TrainerSettings().with_changes(sgt_cof=0.2)
    assert TrainerSettings().with_changes(sgt_coef=0.2).sgt_coef == 0.2


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
    from workers.rollout.settings import GenerationSettings, VLLMEngine

    settings = GenerationSettings(path=str(paths["llama-char"]))
    with pytest.raises(TypeError, match="batchsize"):
        settings.with_changes(batchsize=4)
    with pytest.raises(TypeError, match="gpu_memory_utilization"):
        settings.with_changes(gpu_memory_utilization=0.5)
    with pytest.raises(TypeError):
        VLLMEngine(gpu_memory=0.5)
    worker = GenerationWorker(settings.with_changes(batch_size=4), "llama-char")
    assert worker.backend.batch_size == 4 and worker.model == "llama-char"
