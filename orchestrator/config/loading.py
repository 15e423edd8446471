"""The whole config: the root model, ``--set`` overrides, loading with errors that name the
field, and the redacted dump a run folder keeps."""

from __future__ import annotations

import copy
import re
import warnings
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError, ValidationInfo, model_validator

from graftpool.redaction import redact, register_secrets_in
from graftpool.sections import Strict
from orchestrator.config.algorithm_section import (
    AlgorithmConfig,
    ExchangeConfig,
    move_exchange_keys,
)
from orchestrator.config.base import ConfigError
from orchestrator.config.budgets import (
    full_logits_warnings,
    toy_budget_warnings,
    update_budget_warnings,
)
from orchestrator.config.data_section import DataConfig, derived_response_chars
from orchestrator.config.models_section import ModelConfig, missing_package
from orchestrator.config.run_section import EvalConfig, RayConfig, RunConfig, TrackingConfig
from orchestrator.config.weight_syncs import WEIGHT_SYNCS, keeps_weights
from workers.receiver.gate_kinds import GATE_KINDS
from workers.training.settings import ReceiverSection


class Config(Strict):
    run: RunConfig = RunConfig()
    models: list[ModelConfig]
    data: DataConfig = DataConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    exchange: ExchangeConfig = ExchangeConfig()
    eval: EvalConfig = EvalConfig()
    tracking: TrackingConfig = TrackingConfig()
    ray: RayConfig = RayConfig()

    @property
    def response_chars(self) -> int:
        """What the verifiers read of a response: ``data.max_response_chars``, or when null
        derived from the pool's largest ``generation.max_new_tokens`` (``derived_response_chars``)."""
        if self.data.max_response_chars is not None:
            return self.data.max_response_chars
        return derived_response_chars(max(m.generation.max_new_tokens for m in self.models))

    @property
    def verifier_params(self) -> dict[str, float | int]:
        """How the run's verifier judges an answer, wherever it is built (its actors, ``eval
        --endpoint``, the benchmarks' reports): ``data.verifier_timeout_s`` per answer and
        :attr:`response_chars` of a response."""
        return {"timeout_s": self.data.verifier_timeout_s, "max_chars": self.response_chars}

    @model_validator(mode="before")
    @classmethod
    def _older_exchange_keys(cls, data: Any) -> Any:
        return move_exchange_keys(data)

    @model_validator(mode="after")
    def _check_backends(self, info: ValidationInfo) -> Config:
        if not (info.context or {}).get("check_backends", True):
            return self  # `graftpool build`: the weights need no backend
        trains = (info.context or {}).get("trains", True)  # False: an evaluation, which starts no trainer
        for i, m in enumerate(self.models):
            used = [("generation", m.generation.backend)] + ([("trainer", m.trainer.backend)] if trains else [])
            for field, backend in used:
                package = missing_package(backend)
                if package:
                    raise ValueError(
                        f"models.{i}.{field}.backend: '{backend}' needs the '{package}' package, which this "
                        f"Python environment lacks; install the [{backend}] extra (GPU) or use "
                        f"`make scale-venv` (CPU builds, .venv-scale)")
        return self

    @model_validator(mode="after")
    def _check_overlap(self) -> Config:
        """run.async one_step: pi_old is the behaviour log-probs, and a replica started again must
        get the weights its peers sampled with (the object-store sync keeps them)."""
        if self.run.overlap == "off":
            return self
        if self.algorithm.old_logprobs == "recompute":
            raise ValueError("algorithm.old_logprobs: recompute takes pi_old from the trainer's weights, but with "
                             "run.async: one_step the responses were sampled one update earlier; use auto or sampling")
        for i, m in enumerate(self.models):
            if not keeps_weights(m.generation.weight_sync):
                keeping = [n for n in WEIGHT_SYNCS.names() if keeps_weights(n)]
                raise ValueError(f"models.{i}.generation.weight_sync: run.async: one_step needs {' or '.join(keeping)} "
                                 "(a replica restarted mid-overlap must load the weights its peers sampled with, "
                                 f"which {m.generation.weight_sync} does not keep); got {m.generation.weight_sync}")
            if m.generation.backend == "vllm" and m.generation.vllm.sleep:
                raise ValueError(f"models.{i}.generation.vllm.sleep: the engine sleeps to leave the GPU to the update, "
                                 "but with run.async: one_step it samples the next batch during the update; set "
                                 "sleep: false or run.async: off")
        return self

    @model_validator(mode="after")
    def _check_pool(self) -> Config:
        names = [m.name for m in self.models]
        if len(names) < 1:
            raise ValueError("models: give at least one model")
        if len(set(names)) != len(names):
            raise ValueError(f"models: names must be unique, got {names}")
        return self


def _format_errors(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        path = ".".join(str(p) for p in item["loc"]) or "<root>"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown key"
        got = item.get("input")
        got_text = "" if isinstance(got, dict | list) or got is None else f" (got {got!r})"
        lines.append(f"  {path}: {message}{got_text}")
    return "invalid config:\n" + "\n".join(lines)


class _ConfigLoader(yaml.SafeLoader):
    """YAML with 1.2's booleans: only true / false are booleans. YAML 1.1 also reads a bare yes /
    no / on / off as one, so ``run: {async: off}`` or ``--set run.async=off`` named no mode; here
    they stay strings (a bool field still takes them: pydantic reads "on" / "off" / "yes" / "no")."""


_ConfigLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_ConfigLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_ConfigLoader)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.0.c=value`` -> (["a", "b", "0", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. run.steps=20")
    key, raw = text.split("=", 1)
    try:
        return key.strip().split("."), _yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:  # a ConfigError: the command's "error: ..." and exit 2, no traceback
        raise ConfigError(f"--set {text!r}: the value is not valid YAML (a string YAML cannot read "
                          f"goes in YAML's quotes: KEY=\"'...'\"): {exc}") from None


def apply_override(data: dict, path: list[str], value: Any) -> None:
    """Set ``value`` at ``path`` in nested dicts/lists (list items addressed by index)."""
    node: Any = data
    for i, part in enumerate(path[:-1]):
        where = ".".join(path[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--set {'.'.join(path)}: {where} is not an index of the list")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
            if not isinstance(node, dict | list):
                raise ConfigError(f"--set {'.'.join(path)}: {where} is a value, not a section")
    last = path[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"--set {'.'.join(path)}: {last} is not an index of the list")
        node[int(last)] = value
    else:
        node[last] = value


def load_config(path: str | Path | None = None, overrides: list[str] | None = None,
                data: dict | None = None, check_backends: bool = True, trains: bool = True) -> Config:
    """Read, override and validate a config; raise :class:`ConfigError` on any problem.

    ``check_backends=False`` accepts backends whose packages this environment lacks (vLLM,
    DeepSpeed): ``graftpool build`` makes a config's models without running them. ``trains=False``
    (``graftpool eval``, which starts no trainer) leaves the trainer backends' packages unchecked."""
    if data is not None:
        data = copy.deepcopy(data)  # overrides and validation never change the caller's dict
    else:
        if path is None:
            raise ConfigError("give a config file or a dict")
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = _yaml(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for text in overrides or []:
        apply_override(data, *parse_override(text))
    register_secrets_in(data)  # before validation: an error may quote a value (graftpool.redaction)
    try:
        config = Config.model_validate(data, context={"check_backends": check_backends, "trains": trains})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    _check_exchange(config)
    for line in [*(unread_field_warnings(config) if trains else []), *toy_budget_warnings(config.models),
                 *full_logits_warnings(config.models, config.algorithm.prompt_batch, config.algorithm.n),
                 *update_budget_warnings(config.models, config.algorithm.prompt_batch, config.algorithm.n,
                                         config.algorithm.minibatches)]:
        warnings.warn(line, UserWarning, stacklevel=2)
    return config


def _check_exchange(config: Config) -> None:
    """The exchange (a preset, or a routing with a transfer that fits it) exists, takes its
    params and serves this pool; and what it sets on every trainer rank (``trainer_params``)
    never silently overrides a field the config sets to another value."""
    try:
        policy = config.exchange.policy()
        policy.check_pool(len(config.models))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None
    name = policy.name
    kind = config.exchange.gate_kind
    routing = getattr(policy, "routing", None)
    if GATE_KINDS.get(kind).needs_donor_tokens and routing is not None and not routing.donor_tokens:
        raise ConfigError(f"invalid config:\n  exchange.gate_kind: {kind!r} reads the donors' tokens, which a stored "
                          f"donor (routing {routing.name!r}) does not keep; use 'token_mean' or 'self_calibrated'")
    if config.run.overlap == "one_step" and policy.recompute_source:
        raise ConfigError(f"invalid config:\n  run.async: the policy '{name}' scores the source side "
                          f"with the trainers' pre-update pass, which under one_step is one update newer than the "
                          f"weights that sampled the responses; use run.async: off")
    try:
        trainer_params = policy.trainer_params()  # a transfer's kind modules checked here (importable_module)
    except ValueError as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None
    for key, value in trainer_params.items():
        for section_name in ("exchange", "algorithm"):
            section = getattr(config, section_name)
            if key in section.model_fields_set and getattr(section, key) != value:
                raise ConfigError(f"invalid config:\n  {section_name}.{key}: the policy '{name}' sets "
                                  f"{key} = {value!r} on every trainer, but the config asks for {getattr(section, key)!r}; "
                                  f"remove {section_name}.{key}, or set it through the exchange's params where it takes one")


TOKEN_OBJECTIVE_FIELDS = (("algorithm", "eps_low"), ("algorithm", "eps_high"), ("algorithm", "loss_normalizer"),
                          ("exchange", "peer_ratio"), ("exchange", "shaping_gamma"))
"""What the token-level objective (Eq. 10) reads; a policy with an objective of its own builds it
from its params alone (``workers.training.trainer``: ``make_objective``), so none of these is read."""


def unread_field_warnings(config: Config) -> list[str]:
    """The fields this config sets (``model_fields_set``) that its exchange never reads: the token
    objective's under a policy with an objective of its own (``hacpo``'s ``sequence``), and the
    receiver fields its transfer's route kinds do not read (``Transfer.receiver_fields``: the gate
    under ``sgt`` and ``hacpo``). A user who switches ``exchange.name`` keeps them in the file. Not
    said for an evaluation (``trains=False``), whose run folder's ``config.yaml`` sets every field."""
    policy = config.exchange.policy()
    own_objective = policy.objective(config.algorithm.n) is not None
    unread = list(TOKEN_OBJECTIVE_FIELDS) if own_objective else []
    reads = getattr(getattr(policy, "transfer", None), "receiver_fields", None)
    if reads is not None:
        unread += [("exchange", f) for f in ReceiverSection.model_fields if f not in reads]
    named = [f"{s}.{f}" for s, f in dict.fromkeys(unread) if f in getattr(config, s).model_fields_set]
    if not named:
        return []
    own = " (its receivers train with its own objective, set in exchange.params)" if own_objective else ""
    return [f"{', '.join(named)}: set, but the exchange '{policy.name}' does not read "
            f"{'it' if len(named) == 1 else 'them'}{own}, so this run trains as if unset; remove "
            f"{'it' if len(named) == 1 else 'them'}, or choose an exchange that reads {'it' if len(named) == 1 else 'them'} "
            f"(docs/config.md, exchange policies)"]


def dump_config(config: Config) -> str:
    """The resolved config as YAML, secrets redacted value by value (:func:`redact`: secret
    keys, URI userinfo, registered secrets); it is the run folder's ``config.yaml`` and an
    MLflow artifact."""
    return yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False)
