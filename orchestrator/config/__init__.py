"""The run configuration: one YAML file validated by pydantic before any actor starts.

Defaults are the paper's where it gives one (docs/algorithm.md section 1). An unknown key, a
wrong type or a missing file fails at once with the field's dotted path and what was
expected (:class:`ConfigError`). ``--set a.b=value`` overrides go through the same check.
Validating a config imports no torch.

One module per section: ``models_section`` (models), ``data_section`` (data),
``algorithm_section`` (algorithm, exchange), ``run_section`` (run, eval, tracking, ray);
``loading`` holds the root :class:`Config`, the overrides, :func:`load_config` and
:func:`dump_config`.
"""

from graftpool.redaction import redact
from graftpool.sections import Strict
from orchestrator.config.algorithm_section import AlgorithmConfig, ExchangeConfig
from orchestrator.config.base import SAFE_NAME, ConfigError, SafeName
from orchestrator.config.data_section import FILE_FORMATS, DataConfig, DataSource
from orchestrator.config.loading import (
    Config,
    apply_override,
    dump_config,
    load_config,
    parse_override,
)
from orchestrator.config.models_section import (
    BACKEND_PACKAGES,
    GenerationConfig,
    LoraSettings,
    ModelConfig,
    TrainerConfig,
    VLLMSettings,
    missing_package,
)
from orchestrator.config.run_section import EvalConfig, RayConfig, RunConfig, TrackingConfig
from workers.training.settings import DeepSpeedSettings

__all__ = ["BACKEND_PACKAGES", "FILE_FORMATS", "SAFE_NAME", "AlgorithmConfig", "Config", "ConfigError", "DataConfig",
           "DataSource", "DeepSpeedSettings", "EvalConfig", "ExchangeConfig", "GenerationConfig", "LoraSettings",
           "ModelConfig", "RayConfig", "RunConfig", "SafeName", "Strict", "TrackingConfig", "TrainerConfig",
           "VLLMSettings", "apply_override", "dump_config", "load_config", "missing_package", "parse_override",
           "redact"]
