"""The run configuration: one YAML file validated by pydantic before any actor starts.

Defaults are the paper's where it gives one (docs/algorithm.md section 1). An unknown key, a
wrong type or a missing file fails at once with the field's dotted path and what was
expected (:class:`ConfigError`). ``--set a.b=value`` overrides go through the same check.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from graftpool.redaction import redact, register_secrets_in
from graftpool.tasks import INSTRUCTION
from workers.minibatch import PLACEMENTS
from workers.packaged import PACKAGE_PREFIX, locate
from workers.peer_transfer import PEER_ADVANTAGES
from workers.zoo_spec import ModelSpec

SAFE_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _check_safe_name(name: str) -> str:
    if not SAFE_NAME.match(name):
        raise ValueError("use letters, digits, '_', '-' and '.' only (it names MLflow runs and folders)")
    return name


SafeName = Annotated[str, AfterValidator(_check_safe_name)]
"""A model or run name: it names MLflow runs, run folders and checkpoint folders."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class VLLMSettings(Strict):
    """Engine settings of the ``vllm`` backend (ignored by ``hf``)."""

    tensor_parallel_size: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.15, gt=0, le=1)  # on CPU: the fraction of host memory
    kv_cache_space_gb: float = Field(1.0, gt=0)  # CPU only (VLLM_CPU_KVCACHE_SPACE)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    max_model_len: int | None = Field(None, ge=16)
    enforce_eager: bool = True  # no CUDA graphs, no torch.compile (the sampler's ops included)
    sleep: bool = False  # GPU only: offload weights and free the KV cache between generate calls


class GenerationConfig(Strict):
    backend: Literal["hf", "vllm"] = "hf"
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(16, ge=1)
    batch_size: int = Field(256, ge=1)
    replicas: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0, ge=0)  # per replica; vllm reserves tensor_parallel_size when > 0
    num_threads: int = Field(0, ge=0)  # torch threads per replica; 0: auto (orchestrator.actors.threads_for)
    # trainer -> replicas after each step: object_store (rank 0's state dict through Ray's object
    # store) | collective (rank 0 broadcasts over a gloo / NCCL group, workers.weight_sync)
    weight_sync: Literal["object_store", "collective"] = "object_store"
    sync_bucket_mb: float = Field(256.0, gt=0)  # collective: MiB per broadcast
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per replica (pin to nodes)
    # hf only: the replicas' weights and forward (workers.precision); auto: bfloat16 on a GPU,
    # float32 on a CPU. The trainer casts the weights it sends to it. vllm: vllm.dtype
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    vllm: VLLMSettings = VLLMSettings()

    @model_validator(mode="after")
    def _sleep_needs_gpu(self) -> GenerationConfig:
        if self.vllm.sleep and self.num_gpus == 0:
            raise ValueError("vllm.sleep needs a GPU: set num_gpus > 0, or sleep: false on CPU")
        return self

    @model_validator(mode="after")
    def _dtype_is_hf(self) -> GenerationConfig:
        if self.backend == "vllm" and self.dtype != "auto":
            raise ValueError("dtype is the hf backend's; a vllm engine's dtype is vllm.dtype")
        return self


class DeepSpeedSettings(Strict):
    """ZeRO settings of the ``deepspeed`` trainer (ignored by ``torch``)."""

    zero_stage: Literal[2, 3] = 2
    bf16: bool | None = None  # None: bf16 on GPU, fp32 on CPU


class TrainerConfig(Strict):
    backend: Literal["torch", "deepspeed"] = "torch"
    lr: float = Field(1e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.01, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    grad_accum: int = Field(1, ge=1)  # micro-batches per minibatch (one optimizer step each minibatch)
    workers: int = Field(1, ge=1)
    num_cpus: float = Field(0.5, gt=0)
    num_gpus: float = Field(0, ge=0)  # per data-parallel rank
    num_threads: int = Field(0, ge=0)  # torch threads per rank; 0: auto (orchestrator.actors.threads_for)
    resources: dict[str, float] = Field(default_factory=dict)  # custom Ray resources per rank (pin to nodes)
    # micro-batches packed by tokens (rows x longest row <= this), for scoring and the update;
    # None: grad_accum micro-batches of equal row counts (scoring: 256 rows a forward)
    max_tokens_per_micro_batch: int | None = Field(None, ge=1)
    # log-probs of the sampled tokens from the LM head in chunks of this many response tokens,
    # never a full [rows, T, vocab] log-softmax; None: the model's full logits (reference path)
    logprob_chunk_tokens: int | None = Field(1024, ge=1)
    # rows that share a prompt run its prefix through the backbone once (workers.logprobs.row_logprobs)
    share_prompts: bool = True
    # fp32 | bf16-mixed (autocast bf16 forwards, fp32 master weights and AdamW state) | bf16 (bf16
    # weights); auto: bf16-mixed on a GPU, fp32 on a CPU (workers.precision). deepspeed: bf16-mixed
    # is its bf16, fp32 its fp32; bf16 is refused
    precision: Literal["auto", "fp32", "bf16-mixed", "bf16"] = "auto"
    deepspeed: DeepSpeedSettings = DeepSpeedSettings()

    @model_validator(mode="after")
    def _deepspeed_precision(self) -> TrainerConfig:
        """The deepspeed backend's precision is its engine's ``bf16`` switch
        (``workers.precision.deepspeed_bf16``, checked here without torch)."""
        if self.backend != "deepspeed" or self.precision == "auto":
            return self
        if self.precision == "bf16":
            raise ValueError("precision bf16: the deepspeed backend keeps fp32 master weights; use "
                             "bf16-mixed (DeepSpeed's bf16) or fp32")
        wanted = self.precision == "bf16-mixed"
        if self.deepspeed.bf16 is not None and self.deepspeed.bf16 != wanted:
            raise ValueError(f"precision {self.precision} contradicts deepspeed.bf16: {self.deepspeed.bf16}; "
                             "set one of them")
        return self


class LoraSettings(Strict):
    """LoRA adapters on a frozen base (``models[].lora``, ``workers.lora``, with peft): the
    trainer trains and checkpoints the adapters only, a weight sync sends them only, the final
    export merges them (and keeps them in ``final/<model>/adapter``)."""

    r: int = Field(8, ge=1)  # the adapters' rank
    alpha: float = Field(16.0, gt=0)  # scale alpha / r of the adapters' output
    dropout: float = Field(0.0, ge=0, lt=1)  # on the adapters' input, in the update's forwards only
    # module names (suffixes, peft's matching), "all-linear", or None: peft's default for the
    # architecture (llama, qwen2: q_proj, v_proj; gpt2: c_attn); checked against the model at start
    target_modules: list[str] | Literal["all-linear"] | None = None

    @field_validator("target_modules", mode="before")
    @classmethod
    def _one_name(cls, names: Any) -> Any:
        """One module name may be given as a string."""
        return [names] if isinstance(names, str) and names != "all-linear" else names

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, names: list[str] | str | None) -> list[str] | str | None:
        if isinstance(names, list):
            if not names:
                raise ValueError("give at least one module name, 'all-linear', or leave it unset (peft's default)")
            bad = [n for n in names if not n.strip()]
            if bad or len(set(names)) != len(names):
                raise ValueError(f"expected distinct, non-empty module names, got {names}")
        return names


class ModelConfig(Strict):
    name: SafeName
    # a transformers folder, a .gguf file, or package:<python package>/<file> (workers.packaged)
    path: Path | None = None
    builder: ModelSpec | None = None  # a tiny model built in code (workers.model_zoo)
    trust_remote_code: bool = False
    # auto: prompts are rendered with the tokenizer's chat template when it has one (workers.chat)
    chat_template: Literal["auto", "none"] = "auto"
    # placement-group strategy of the model's actors: pack (few nodes) | spread (many nodes)
    placement: Literal["pack", "spread"] = "pack"
    generation: GenerationConfig = GenerationConfig()
    trainer: TrainerConfig = TrainerConfig()
    lora: LoraSettings | None = None  # None: the full model is trained

    @model_validator(mode="after")
    def _lora_needs_torch(self) -> ModelConfig:
        if self.lora is not None and self.trainer.backend == "deepspeed":
            raise ValueError("lora: the deepspeed trainer backend does not train LoRA adapters (ZeRO shards "
                             "the full model's optimizer state); use trainer.backend: torch, or drop lora")
        return self

    @model_validator(mode="before")
    @classmethod
    def _builder_takes_the_model_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("builder"), dict):
            data = {**data, "builder": {"name": str(data.get("name", "")), **data["builder"]}}
        return data

    @field_validator("path")
    @classmethod
    def _path_exists(cls, path: Path | None) -> Path | None:
        if path is not None and str(path).startswith(PACKAGE_PREFIX):
            locate(path)  # says which package is missing
        elif path is not None and not path.exists():
            raise ValueError(f"no model folder or .gguf file at {path}")
        return path

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.builder is None):
            raise ValueError("give exactly one of 'path' (a local model folder) or 'builder'")
        return self


# Backends and the Python package each needs (the optional extras of pyproject.toml).
BACKEND_PACKAGES = {"vllm": "vllm", "deepspeed": "deepspeed"}


def missing_package(backend: str) -> str | None:
    """The package a backend needs that this Python environment lacks, if any."""
    import importlib.util

    package = BACKEND_PACKAGES.get(backend)
    return package if package and importlib.util.find_spec(package) is None else None


FILE_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv", ".arrow": "arrow"}
"""Local file suffixes ``source: file`` reads (graftpool.tasks.read_table), and their format."""


class DataSource(Strict):
    """Synthetic tasks generated in code, or a local data file with mapped columns.

    ``file`` reads JSON / JSON Lines, Parquet, CSV and Arrow files, local paths only (nothing
    is downloaded); ``jsonl`` and ``parquet`` are the same reader for those suffixes."""

    name: str = "train"
    source: Literal["synthetic", "file", "jsonl", "parquet"] = "synthetic"
    path: Path | None = None
    question_field: str = "problem"  # the column holding the question (problem_key: its older name)
    answer_field: str = "answer"  # the column holding the gold answer (answer_key: its older name)
    id_field: str | None = None  # a column of unique ids to use as prompt ids (default: a hash of the prompt)
    task_field: str | None = None  # a column naming each row's task (default: the file's stem)
    split: str | None = None  # keep only rows whose split_field column equals this
    split_field: str = "split"
    # a seeded split of the file (with ``seed``): the train source takes the train side, an eval
    # source on the same file with the same eval_fraction and seed takes the held-out side
    eval_fraction: float | None = Field(None, gt=0, lt=1)
    tasks: list[str] = Field(default_factory=lambda: ["add"])
    size: int = Field(256, ge=1)
    seed: int = 0
    instruction: str = Field(
        INSTRUCTION, description="appended to every question; '' for already formatted files"
    )

    @model_validator(mode="before")
    @classmethod
    def _older_key_names(cls, data: Any) -> Any:
        """``problem_key`` / ``answer_key`` are the older names of ``question_field`` / ``answer_field``."""
        if isinstance(data, dict):
            for old, new in (("problem_key", "question_field"), ("answer_key", "answer_field")):
                if old in data:
                    if new in data:
                        raise ValueError(f"give {new} only ({old} is its older name)")
                    data = {**{k: v for k, v in data.items() if k != old}, new: data[old]}
        return data

    @field_validator("path", mode="before")
    @classmethod
    def _local_only(cls, path: Any) -> Any:
        text = str(path) if path is not None else ""
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", text) or text.startswith("hf:"):
            raise ValueError(f"local files only, nothing is downloaded: {text!r} is a URL; "
                             "download it and give its local path")
        if re.fullmatch(r"[\w.-]+/[\w.-]+", text) and not Path(text).exists() and Path(text).suffix == "":
            raise ValueError(f"local files only, nothing is downloaded: {text!r} looks like a Hugging Face "
                             "hub id; download the data set and give a local file (json, jsonl, parquet, csv, arrow)")
        return path

    @model_validator(mode="after")
    def _file_for_files(self) -> DataSource:
        if self.source != "synthetic":
            if self.path is None:
                raise ValueError(f"source '{self.source}' needs 'path'")
            if not self.path.exists():
                raise ValueError(f"no data file at {self.path}")
            suffix = self.path.suffix.lower()
            allowed = {"jsonl": (".jsonl", ".json"), "parquet": (".parquet",)}.get(self.source, tuple(FILE_FORMATS))
            if not self.path.is_file() or suffix not in allowed:
                raise ValueError(f"source '{self.source}' reads {', '.join(allowed)} files, got {self.path}")
        return self


class DataConfig(Strict):
    train: DataSource = DataSource()
    eval: list[DataSource] = Field(default_factory=list)
    # math | exact | python:package.module:function | python:/path/to/file.py:function (a reward
    # plugin, workers.plugin_verifier)
    verifier: str = "math"
    verifier_actors: int = Field(2, ge=1)
    verifier_timeout_s: float = Field(2.0, gt=0)
    # answers the verifier's settle() decides (integers, no boxed answer, ...) are judged in the
    # driver with the same verdict, never sent to a verifier actor; false: every answer goes
    fast_path: bool = True

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, name: str) -> str:
        from workers.verifier import PLUGIN_PREFIX, available_verifiers

        if name.startswith(PLUGIN_PREFIX):
            from workers.plugin_verifier import check_target

            return PLUGIN_PREFIX + check_target(name[len(PLUGIN_PREFIX):])
        builtin = [v for v in available_verifiers() if v != "python"]
        if name not in builtin:
            raise ValueError(f"expected one of {builtin} or python:package.module:function "
                             f"(python:/path/to/file.py:function), got {name!r}")
        return name


class AlgorithmConfig(Strict):
    n: int = Field(8, ge=2, description="responses per prompt")
    prompt_batch: int = Field(128, ge=1)
    eps_low: float = Field(0.2, ge=0)
    eps_high: float = Field(0.28, ge=0)
    delta: float = Field(0.8, ge=0)
    minibatches: int = Field(4, ge=1)
    epochs: int = Field(1, ge=1)
    peer_last: bool = True  # false: the peer-first ablation, the same as peer_placement: first
    # where peer groups go among the minibatches (workers.minibatch): last (paper) | first | spread
    peer_placement: str = "last"
    # a minibatch's token-mean denominator (workers.objective): minibatch (paper) | step
    loss_normalizer: Literal["minibatch", "step"] = "minibatch"
    # peer tokens' term in Eq. 10 (workers.objective): clip (paper) | shaped (LUFFY's f(pi) = pi / (pi + gamma))
    peer_ratio: Literal["clip", "shaped"] = "clip"
    shaping_gamma: float = Field(0.1, gt=0)  # LUFFY's gamma (peer_ratio: shaped)
    gate: bool = True  # False: the no-gate ablation (w = 1 for every grafted response)
    # how a receiver takes in a donor group (workers.peer_transfer); defaults are the paper's
    peer_responses: Literal["all", "success"] = "all"  # success: only the donor's correct responses
    peer_advantages: str = "donor"  # donor | pooled | recentered | asymmetric
    peer_beta: float = Field(0.5, ge=0, le=1)  # asymmetric: the scale of negative peer advantages
    gate_scope: Literal["response", "group"] = "response"  # group: admit or drop a group on its mean s
    # where pi_old comes from (workers.old_logprobs): auto skips the extra forward pass when the
    # update is one optimizer step (exactly on-policy); recompute always runs it
    old_logprobs: Literal["auto", "recompute"] = "auto"

    @field_validator("peer_advantages", "peer_placement")
    @classmethod
    def _registered(cls, name: str, info: ValidationInfo) -> str:
        registry = {"peer_advantages": PEER_ADVANTAGES, "peer_placement": PLACEMENTS}[info.field_name]
        if name not in registry.names():
            raise ValueError(f"expected one of {registry.names()}, got {name!r}")
        return name

    @model_validator(mode="before")
    @classmethod
    def _peer_first(cls, data: Any) -> Any:
        """``peer_last: false`` (the older switch) is ``peer_placement: first``."""
        if isinstance(data, dict) and data.get("peer_last") is False:
            placement = data.get("peer_placement", "first")
            if placement not in ("last", "first"):
                raise ValueError(f"algorithm.peer_last: false asks for peer_placement 'first', but "
                                 f"peer_placement is {placement!r}; set only peer_placement")
            data = {**data, "peer_placement": "first"}
        return data


class ExchangeConfig(Strict):
    name: str = "graft"
    params: dict[str, Any] = Field(default_factory=dict)


class EvalConfig(Strict):
    samples: int = Field(8, ge=1)
    temperature: float = Field(0.6, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    max_prompts: int | None = Field(None, ge=1)


class RunConfig(Strict):
    name: SafeName = "run"
    steps: int = Field(10, ge=1)
    eval_every: int = Field(5, ge=0)
    eval_at_start: bool = False  # also evaluate the starting models, as step 0 (learning curves from 0)
    checkpoint_every: int = Field(0, ge=0)  # save trainer + controller state every K steps
    keep_checkpoints: int = Field(2, ge=1)  # the last K checkpoints are kept
    resume: bool = False  # continue from the latest complete checkpoint in the run folder, if any
    max_step_retries: int = Field(2, ge=0)  # actor deaths survived per step before the run fails
    max_restarts: int = Field(3, ge=0)  # restarts of one actor within restart_window_s; one more stops the run
    restart_window_s: float = Field(600.0, gt=0)
    seed: int = 0
    output_dir: Path = Path("runs")
    # the run's durable copy (orchestrator.storage): a path or a pyarrow filesystem URI
    # (file:///..., s3://bucket/prefix); checkpoints, store, final models go there as written
    storage: str | None = None


class TrackingConfig(Strict):
    uri: str | None = None  # None: sqlite:///<run.output_dir>/mlflow.db, or $MLFLOW_TRACKING_URI
    experiment: str = "graftpool"


class RayConfig(Strict):
    address: str | None = None  # None: a local instance (or the cluster under `ray job submit`)
    num_cpus: int | None = None


class Config(Strict):
    run: RunConfig = RunConfig()
    models: list[ModelConfig]
    data: DataConfig = DataConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    exchange: ExchangeConfig = ExchangeConfig()
    eval: EvalConfig = EvalConfig()
    tracking: TrackingConfig = TrackingConfig()
    ray: RayConfig = RayConfig()

    @model_validator(mode="after")
    def _check_backends(self, info: ValidationInfo) -> Config:
        if not (info.context or {}).get("check_backends", True):
            return self  # `graftpool build`: the weights need no backend
        for i, m in enumerate(self.models):
            for field, backend in (("generation", m.generation.backend), ("trainer", m.trainer.backend)):
                package = missing_package(backend)
                if package:
                    raise ValueError(
                        f"models.{i}.{field}.backend: '{backend}' needs the '{package}' package, which this "
                        f"Python environment lacks; install the [{backend}] extra (GPU) or use "
                        f"`make scale-venv` (CPU builds, .venv-scale)")
        return self

    @model_validator(mode="after")
    def _check_pool(self) -> Config:
        names = [m.name for m in self.models]
        if len(names) < 1:
            raise ValueError("models: give at least one model")
        if len(set(names)) != len(names):
            raise ValueError(f"models: names must be unique, got {names}")
        return self


class ConfigError(ValueError):
    """A configuration problem, phrased for the user: field path and what was expected."""


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


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.0.c=value`` -> (["a", "b", "0", "c"], value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. run.steps=20")
    key, raw = text.split("=", 1)
    return key.strip().split("."), yaml.safe_load(raw) if raw.strip() else ""


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
                data: dict | None = None, check_backends: bool = True) -> Config:
    """Read, override and validate a config; raise :class:`ConfigError` on any problem.

    ``check_backends=False`` accepts backends whose packages this environment lacks (vLLM,
    DeepSpeed): ``graftpool build`` makes a config's models without running them."""
    if data is None:
        if path is None:
            raise ConfigError("give a config file or a dict")
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
    for text in overrides or []:
        apply_override(data, *parse_override(text))
    register_secrets_in(data)  # before validation: an error may quote a value (graftpool.redaction)
    try:
        config = Config.model_validate(data, context={"check_backends": check_backends})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from None
    _check_exchange(config)
    return config


def _check_exchange(config: Config) -> None:
    from policies import make_policy  # registry validation without building actors

    try:
        make_policy(config.exchange.name, **config.exchange.params).check_pool(len(config.models))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None


def dump_config(config: Config) -> str:
    """The resolved config as YAML, secrets redacted value by value (:func:`redact`: secret
    keys, URI userinfo, registered secrets); it is the run folder's ``config.yaml`` and an
    MLflow artifact."""
    return yaml.safe_dump(redact(config.model_dump(mode="json")), sort_keys=False)
