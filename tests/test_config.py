"""Config validation: errors name the field and what was expected; --set overrides."""

import importlib.util
from pathlib import Path

import pytest
import yaml

from orchestrator.config import ConfigError, dump_config, load_config

BASE = {
    "models": [
        {"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}},
        {"name": "b", "builder": {"arch": "gpt2", "tokenizer": "bpe"}},
    ]
}


def _load(data, overrides=None):
    return load_config(data=data, overrides=overrides)  # load_config copies data (tested below)


def test_paper_defaults():
    config = _load(BASE)
    algo = config.algorithm
    assert (algo.n, algo.eps_low, algo.eps_high, config.exchange.delta, algo.minibatches, algo.prompt_batch) == (
        8, 0.2, 0.28, 0.8, 4, 128)
    trainer = config.models[0].trainer
    assert (trainer.lr, trainer.betas, trainer.weight_decay, trainer.grad_clip) == (1e-6, (0.9, 0.999), 0.01, 1.0)
    assert config.models[0].generation.temperature == 1.0 and config.models[0].generation.top_p == 1.0
    assert (config.eval.temperature, config.eval.top_p, config.eval.samples) == (0.6, 0.95, 8)
    assert config.models[0].builder.name == "a"  # the builder takes the model's name


def test_unknown_key_wrong_type_and_bad_choice_are_named():
    data = {**BASE, "algorithm": {"n": "eight", "epsilon": 0.1}}
    data["models"] = [dict(BASE["models"][0], builder={"arch": "bert", "tokenizer": "char"}), BASE["models"][1]]
    with pytest.raises(ConfigError) as err:
        _load(data)
    text = str(err.value)
    assert "algorithm.n: Input should be a valid integer" in text and "'eight'" in text
    assert "algorithm.epsilon: unknown key" in text
    assert "models.0.builder.arch" in text and "'llama', 'gpt2' or 'qwen2'" in text


def test_missing_model_path_and_data_file_are_named(tmp_path):
    data = {"models": [{"name": "a", "path": str(tmp_path / "nope")}],
            "data": {"train": {"source": "jsonl", "path": str(tmp_path / "train.jsonl")}},
            "exchange": {"name": "none"}}
    with pytest.raises(ConfigError) as err:
        _load(data)
    assert f"models.0.path: no model folder or .gguf file at {tmp_path / 'nope'}" in str(err.value)
    assert "data.train: no data file at" in str(err.value)


def test_model_needs_exactly_one_source(tmp_path):
    with pytest.raises(ConfigError, match="exactly one of 'path'"):
        _load({"models": [{"name": "a"}], "exchange": {"name": "none"}})


def test_duplicate_and_unsafe_names():
    with pytest.raises(ConfigError, match="names must be unique"):
        _load({"models": [BASE["models"][0], BASE["models"][0]]})
    with pytest.raises(ConfigError, match="models.0.name"):
        _load({"models": [dict(BASE["models"][0], name="a b")], "exchange": {"name": "none"}})
    with pytest.raises(ConfigError, match=r"run.name: use letters, digits"):
        _load(BASE, ["run.name=x/y"])
    # two eval sets of one name would key one result and one set of metrics: the second is named
    evals = [{"tasks": ["add"]}, {"name": "sub", "tasks": ["sub"]}, {"tasks": ["mod"]}]
    with pytest.raises(ConfigError, match=r"data.eval.0 and data.eval.2 are both named 'train'; set data.eval.2.name"):
        _load({**BASE, "data": {"eval": evals}})
    evals[2]["name"] = "mod"
    assert [s.name for s in _load({**BASE, "data": {"eval": evals}}).data.eval] == ["train", "sub", "mod"]


def test_values_that_would_fail_or_mislead_later_fail_at_load_naming_the_field():
    """Each of these used to load and then crash inside an actor, or run something other than
    what the config says (a path ignored, a folder outside the output folder, an eval set lost)."""
    builder = {"name": "a", "builder": {"arch": "llama", "tokenizer": "char"}}
    cases = [
        (["run.seed=-1"], r"run.seed: Input should be greater than or equal to 0"),
        (["models.0.trainer.betas=[0.9,1.5]"], r"models.0.trainer.betas.1: Input should be less than 1"),
        (["algorithm.eps_low=1.5"], r"algorithm.eps_low: Input should be less than 1"),
        (["run.name=.."], r"run.name: '..' names no folder of its own"),
        (["models.1.name=."], r"models.1.name: '.' names no folder of its own"),
        (["models.0.generation.max_new_tokens=128"], r"models.0: generation.max_new_tokens \(128\) leaves no room"),
        (["models.0.builder.num_heads=3"], r"models.0.builder: hidden_size \(64\) / num_heads \(3\)"),
        (["models.0.builder.sft_tasks={nosuch: 1}"], r"models.0.builder: sft_tasks: unknown task\(s\) \['nosuch'\]"),
        (["models.0.builder.sft_tasks={add: 0}"], r"models.0.builder: sft_tasks: task weights must be non-negative with a positive sum"),
        (["data.train.path=x.jsonl"], r"data.train: source 'synthetic' generates its problems and would ignore path"),
        (["data.train.tasks=[add, nosuch]"], r"data.train: tasks: unknown task\(s\) \['nosuch'\]; known: \['add'"),
        (["ray.num_cpus=-1"], r"ray.num_cpus: Input should be greater than or equal to 1"),
        (["ray.wait_for_resources_s=-1"], r"ray.wait_for_resources_s: Input should be greater than or equal to 0"),
        (["algorithm.peer_last=maybe"], r"algorithm.peer_last: expected true or false"),
        (["exchange.name=sgt", "exchange.params.coef=abc"], r"exchange.params.coef: expected float"),
        (["exchange.name=hacpo", "run.async=one_step"], r"run.async: the policy 'hacpo' scores the source side"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            _load(BASE, overrides)
    with pytest.raises(ConfigError, match=r"exchange.name: 'hacpo' shares rollouts among at least 2 models"):
        _load({"models": [builder], "exchange": {"name": "hacpo"}})
    vllm_sleep = ["models.0.generation.backend=vllm", "models.0.generation.num_gpus=1",
                  "models.0.generation.vllm.sleep=true", "run.async=one_step"]
    with pytest.raises(ConfigError, match=r"models.0.generation.vllm.sleep: the engine sleeps to leave the GPU"):
        load_config(data=dict(BASE), overrides=vllm_sleep, check_backends=False)
    # the deprecated switch read as a boolean: a YAML 1.2 'no' (a string) asks for peer-first
    assert _load(BASE, ["algorithm.peer_last=no"]).exchange.peer_placement == "first"
    # a builder without a task mix warms up on every task alike; the caller's dict is left alone
    data = {"models": [builder, BASE["models"][1]]}
    config = load_config(data=data, overrides=["run.name=kept"])
    assert config.models[0].builder.sft_tasks == {} and config.models[0].builder.sft_data()
    assert data == {"models": [builder, BASE["models"][1]]} and "run" not in data


def test_exchange_policy_is_checked_against_the_registry():
    with pytest.raises(ConfigError, match="unknown policy 'grafted'"):
        _load({**BASE, "exchange": {"name": "grafted"}})
    with pytest.raises(ConfigError, match="has no parameter"):
        _load({**BASE, "exchange": {"name": "pool", "params": {"strategy": "x"}}})
    three = {"models": BASE["models"] + [{"name": "c", "builder": {"arch": "qwen2", "tokenizer": "char"}}]}
    with pytest.raises(ConfigError, match="'graft' pairs exactly 2 models"):
        _load(three)
    assert _load({**three, "exchange": {"name": "pool", "params": {"balance": "pool"}}}).exchange.name == "pool"


def test_set_overrides_nested_fields_and_list_items():
    config = _load(BASE, ["run.steps=3", "models.1.generation.temperature=0.5", "exchange.name=none",
                          "exchange.peer_placement=first"])
    assert config.run.steps == 3
    assert config.models[1].generation.temperature == 0.5
    assert config.exchange.name == "none" and config.exchange.peer_placement == "first"


def test_run_async_off_survives_yamls_booleans(tmp_path):
    """YAML 1.1 reads a bare ``off`` as false: the config's YAML keeps 1.2's booleans, so
    ``async: off`` in a file and ``--set run.async=off`` are both the mode ``off``; ``true`` names
    no mode and is refused naming the field."""
    assert _load(BASE, ["run.async=off"]).run.overlap == "off"
    assert _load(BASE, ["run.async=one_step"]).run.overlap == "one_step"
    config_file = tmp_path / "pair.yaml"
    config_file.write_text(yaml.safe_dump(BASE) + "run: {steps: 2, async: off}\n")
    assert load_config(config_file).run.overlap == "off"
    with pytest.raises(ConfigError, match="run.async"):
        _load(BASE, ["run.async=true"])
    # a bool field still reads YAML 1.1's words, and true / false stay booleans
    assert _load(BASE, ["run.eval_at_start=on"]).run.eval_at_start is True
    assert _load(BASE, ["run.eval_at_start=no"]).run.eval_at_start is False
    both = _load(BASE, ["run.eval_at_start=true", "run.resume=False"]).run
    assert both.eval_at_start is True and both.resume is False


def test_bad_overrides_are_named():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        _load(BASE, ["run.steps"])
    with pytest.raises(ConfigError, match="run.steps: Input should be a valid integer"):
        _load(BASE, ["run.steps=many"])
    with pytest.raises(ConfigError, match="not an index"):
        _load(BASE, ["models.5.name=x"])
    # a value YAML cannot read (an unclosed list, a leading '@') is the command's error, not a traceback
    with pytest.raises(ConfigError, match="the value is not valid YAML"):
        _load(BASE, ["data.eval=[a"])
    with pytest.raises(ConfigError, match="the value is not valid YAML"):
        _load(BASE, ["run.name=@exp"])


def test_config_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_dump_round_trips(tmp_path):
    config = _load(BASE, ["run.steps=4"])
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(config))
    assert load_config(path) == config


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None or importlib.util.find_spec("deepspeed") is not None,
                    reason="this environment has the scale backends (.venv-scale): nothing is missing")
def test_backends_whose_package_is_missing_fail_at_config_time():
    with pytest.raises(ConfigError, match=r"models.1.generation.backend: 'vllm' needs the 'vllm' package"):
        _load(BASE, ["models.1.generation.backend=vllm"])
    with pytest.raises(ConfigError, match=r"models.0.trainer.backend: 'deepspeed' needs the 'deepspeed' package"):
        _load(BASE, ["models.0.trainer.backend=deepspeed"])


def test_scale_backend_settings_are_checked():
    with pytest.raises(ConfigError, match=r"vllm.sleep needs a GPU"):
        _load(BASE, ["models.0.generation.vllm.sleep=true"])
    with pytest.raises(ConfigError, match=r"models.0.trainer.deepspeed.zero_stage"):
        _load(BASE, ["models.0.trainer.deepspeed.zero_stage=1"])
    with pytest.raises(ConfigError, match=r"models.0.trainer.grad_accum"):
        _load(BASE, ["models.0.trainer.grad_accum=0"])


def test_validating_a_config_loads_no_torch():
    """``graftpool`` commands and `ray job submit` validate before any actor starts: reading a
    YAML file must not cost torch's and transformers' import (seconds per process); nor does
    run.async one_step's check of the weight-sync mode (a built-in mode's module imports torch)."""
    import subprocess
    import sys

    code = ("import sys; from orchestrator.config import load_config; "
            "load_config('configs/learning_pair.yaml', ['exchange.peer_placement=spread', "
            "'algorithm.loss_normalizer=step', 'exchange.peer_ratio=shaped', 'run.async=one_step']); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parent.parent)
    assert out.stdout.strip() == "[]"


def test_the_exchange_options_name_their_registries_entries():
    """The config's choices for the trainer-side registries are what is registered, no list of its own."""
    from workers.receiver.objective import LOSS_NORMALIZERS, PEER_RATIOS

    assert LOSS_NORMALIZERS.names() == ["minibatch", "step"] and PEER_RATIOS.names() == ["clip", "shaped"]
    with pytest.raises(ConfigError, match=r"exchange.peer_placement: expected one of \['first', 'last', 'spread'\]"):
        _load(BASE, ["exchange.peer_placement=middle"])
    with pytest.raises(ConfigError, match=r"exchange.peer_beta"):
        _load(BASE, ["exchange.peer_beta=2"])


class PluginEntry:
    """A plugin's entry, registered by this test's module: a module of the project, which the actors
    import (an entry from elsewhere must be a lazy one, ``graftpool.registry``)."""


REGISTERED_FIELDS = [  # (registry, the override that names an entry, a built-in of the registry)
    ("LOSS_NORMALIZERS", "algorithm.loss_normalizer", "step"),
    ("PEER_RATIOS", "exchange.peer_ratio", "shaped"),
    ("PRECISIONS", "models.0.trainer.precision", "bf16"),
    ("TRAINERS", "models.0.trainer.backend", "torch"),
    ("BACKENDS", "models.0.generation.backend", "hf"),
]


@pytest.mark.parametrize(("registry", "field", "builtin"), REGISTERED_FIELDS)
def test_a_name_registered_in_a_registry_is_a_name_the_config_takes(registry, field, builtin):
    """A name field is checked against its registry (``workers.registries``), not a list of its own:
    a name registered by a plugin (here: by the test) loads, an unknown one is refused naming the
    field, the value and the registered names."""
    import workers.registries

    entries = getattr(workers.registries, registry)
    with pytest.raises(ConfigError, match=rf"{field}: expected one of \[.*'{builtin}'.*\] \(got 'plugin-entry'\)"):
        _load(BASE, [f"{field}=plugin-entry"])
    entries.register("plugin-entry")(PluginEntry)
    try:
        config = _load(BASE, [f"{field}=plugin-entry"])
    finally:
        entries.unregister("plugin-entry")
    section = config
    for part in field.split("."):
        section = section[int(part)] if part.isdigit() else getattr(section, part)
    assert section == "plugin-entry"
    with pytest.raises(ConfigError, match=field):
        _load(BASE, [f"{field}=plugin-entry"])


def test_a_registrys_built_in_names_are_what_their_modules_register():
    """The registries the config reads declare their built-ins lazily (no torch at load); each
    lazy name is one its module registers on the first lookup."""
    import workers.registries

    for registry in (workers.registries.TRAINERS, workers.registries.BACKENDS, workers.registries.PRECISIONS,
                     workers.registries.LOSS_NORMALIZERS, workers.registries.PEER_RATIOS):
        for name in registry.lazy:
            if name in ("vllm", "deepspeed") and importlib.util.find_spec(name) is None:
                continue  # an optional extra this environment lacks
            assert registry.get(name) is not None, (registry.field, name)


def test_the_older_algorithm_spellings_of_exchange_options_still_work_with_a_deprecation_warning():
    """The exchange options moved from ``algorithm`` to ``exchange``; for one release the older
    keys are read and moved, each with a DeprecationWarning naming the new key, and the same key
    in both places with different values is an error naming both."""
    with pytest.warns(DeprecationWarning, match="algorithm.delta is deprecated: it moved to exchange.delta"):
        config = _load(BASE, ["algorithm.delta=0.5", "algorithm.peer_advantages=pooled"])
    assert (config.exchange.delta, config.exchange.peer_advantages) == (0.5, "pooled")
    assert "delta" not in config.algorithm.model_dump()
    with pytest.warns(DeprecationWarning, match="algorithm.peer_last is deprecated"):
        assert _load(BASE, ["algorithm.peer_last=false"]).exchange.peer_placement == "first"
    with pytest.raises(ConfigError, match=r"algorithm.delta \(0.5\) and exchange.delta \(0.7\) disagree"):
        _load(BASE, ["algorithm.delta=0.5", "exchange.delta=0.7"])
    with pytest.raises(ConfigError, match=r"peer_last: false asks for peer_placement 'first'"):
        _load(BASE, ["algorithm.peer_last=false", "algorithm.peer_placement=spread"])


def test_a_policys_trainer_setting_never_silently_overrides_the_configs():
    """A policy's ``trainer_params`` set fields of every rank's TrainerSettings; where the config sets
    the same field (``exchange.*`` or ``algorithm.*``) to another value, loading fails naming both."""
    from dataclasses import dataclass

    from policies.interface import POLICIES, ExchangePolicy, register_policy

    @register_policy("test-strict-gate")
    @dataclass
    class StrictGate(ExchangePolicy):
        def plan(self, inp):
            return []

        def trainer_params(self):
            return {"delta": 0.95}

    try:
        assert _load(BASE, ["exchange.name=test-strict-gate"]).exchange.delta == 0.8  # the default: the policy's wins
        assert _load(BASE, ["exchange.name=test-strict-gate", "exchange.delta=0.95"]).exchange.delta == 0.95
        with pytest.raises(ConfigError, match=r"exchange.delta: the policy 'test-strict-gate' sets delta = 0.95 .*"
                                              r"asks for 0.9"):
            _load(BASE, ["exchange.name=test-strict-gate", "exchange.delta=0.9"])
    finally:
        POLICIES._entries.pop("test-strict-gate", None)


def test_the_gpu_checks_plans_validate_and_say_what_falls_back():
    """``benchmarks/gpu_check.py``: with hf generation its config is valid with no optional
    package (the torch trainer for both models); what a missing package or a single GPU changes is
    said, not hidden (the check itself needs a CUDA GPU)."""
    from benchmarks.gpu_check import config_data, plan

    choice, notes = plan("hf", 1, has_deepspeed=False, has_vllm=False)
    assert choice == {"generation": "hf", "trainer_a": "torch", "sync_b": "collective", "trainer_b_gpus": 0.25}
    assert any("DeepSpeed is not installed" in n for n in notes) and any("Duplicate GPU detected" in n for n in notes)
    config = load_config(data=config_data(2, 16, Path("runs"), **choice))
    assert [m.generation.dtype for m in config.models] == ["bfloat16", "bfloat16"]
    assert [m.trainer.precision for m in config.models] == ["bf16-mixed", "bf16-mixed"]
    assert config.models[1].generation.weight_sync == "collective"
    assert plan("vllm", 2, has_deepspeed=True, has_vllm=False)[0]["generation"] == "hf"
    assert plan("vllm", 2, has_deepspeed=True, has_vllm=True) == (
        {"generation": "vllm", "trainer_a": "deepspeed", "sync_b": "collective", "trainer_b_gpus": 1.0}, [])


def test_an_experiment_name_mlflow_refuses_is_refused_at_load():
    """MLflow refuses an empty experiment name and one over 500 characters; such a name passed the
    load, and the job then logged nothing to MLflow, its warnings calling the store unreachable
    (issue #51's fortieth read, half b). Refused at load, naming the field."""
    for bad in ["tracking.experiment=''", f"tracking.experiment={'x' * 501}"]:
        with pytest.raises(ConfigError, match="tracking.experiment"):
            _load(BASE, [bad])
    assert _load(BASE, [f"tracking.experiment={'x' * 500}"]).tracking.experiment == "x" * 500
