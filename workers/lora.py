"""LoRA adapters per model (``models[].lora``), with ``peft``.

A model with ``lora`` set trains low-rank adapters on a frozen base: the trainer (``torch``
backend) and every ``hf`` generation replica load the same base weights and inject the same
adapters into it in place (:func:`add_adapters`: ``peft.get_peft_model``, its layers replacing
the targeted ``Linear`` / ``Conv1D`` modules of the transformers model, which stays the object
the rest of the code runs). The adapters start equal on every actor: they are initialised
from ``init_seed`` in a forked torch RNG (peft's default init: A Kaiming-uniform, B zero, so the
adapted model starts as the base model), and the actor's own torch RNG stream is left as it was.

What changes with LoRA, and nothing else:

- the trainer's AdamW covers the adapter parameters only (the base is frozen: no gradient, no
  optimizer state), and a checkpoint holds the adapter weights, the optimizer state, the
  version and RNG states (:func:`adapter_state`, :func:`load_adapter_state`);
- a weight sync (object store or collective) sends the adapter weights only; a replica copies
  them into its adapters in place (its base never changes);
- scoring forwards (pi_old, the gate's s) run with dropout off, as the replicas do; the
  update's forwards with ``dropout`` on (0, the default, keeps the update exactly on-policy);
- the final export (``final/<model>``) is the merged model, W + (alpha / r) B A, as a plain
  transformers folder that ``graftpool eval``, ``graftpool serve`` and vLLM load unchanged, and
  the adapters beside it in ``final/<model>/adapter`` (peft's format:
  ``PeftModel.from_pretrained(base, folder)``).

This module imports peft only when a model uses LoRA; :func:`check_targets` builds the model
on the meta device (no weights) to check ``target_modules`` before any actor starts.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from workers.model_export import save_model

ADAPTER = "default"  # peft's adapter name (the one adapter per model)
ADAPTER_FOLDER = "adapter"  # final/<model>/adapter: the adapters in peft's format


def _peft_config(lora: Mapping):
    """peft's ``LoraConfig`` for a ``models[].lora`` dict (``r``, ``alpha``, ``dropout``,
    ``target_modules``; None: peft's default modules for the architecture)."""
    from peft import LoraConfig

    targets = lora.get("target_modules")
    return LoraConfig(r=int(lora["r"]), lora_alpha=float(lora["alpha"]), lora_dropout=float(lora["dropout"]),
                      target_modules=list(targets) if isinstance(targets, list | tuple) else targets,
                      bias="none", task_type="CAUSAL_LM")


def add_adapters(model: torch.nn.Module, lora: Mapping, init_seed: int):
    """Inject the adapters into ``model`` in place (its targeted modules become peft LoRA
    layers; ``model`` is still the transformers model) and freeze everything else. The adapter
    weights are drawn from ``init_seed`` in a forked CPU RNG: every actor of the model gets the same
    ones, and the caller's torch RNGs (the CPU's and a GPU's) are untouched. Returns the ``PeftModel`` around ``model``
    (for saving the adapters)."""
    from peft import get_peft_model

    # peft draws the adapters on the CPU, then moves them to the base layer's device: only the CPU
    # generator is seeded (and forked). torch.manual_seed would seed every CUDA generator too, which
    # fork_rng(devices=[]) does not put back: an hf replica on a GPU, which samples from its device's
    # generator, would sample from init_seed's stream, every replica of the model from the same one
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")  # gpt2's Conv1D: peft sets it
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")
        torch.default_generator.manual_seed(init_seed)
        peft_model = get_peft_model(model, _peft_config(lora))
    if peft_model.base_model.model is not model:
        raise RuntimeError("peft did not inject the adapters into the model in place")
    return peft_model


def adapter_names(model: torch.nn.Module) -> list[str]:
    """The adapter weights' names in ``model.state_dict()`` order (the trainable parameters
    after :func:`add_adapters`)."""
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    return [name for name in model.state_dict() if name in trainable]


def adapter_state(model: torch.nn.Module, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """The adapter tensors as they are (detached, on their device, no copy)."""
    state = model.state_dict()
    return {name: state[name].detach() for name in names}


@torch.no_grad()
def load_adapter_state(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]],
                       names: Iterable[str]) -> None:
    """Copy (name, tensor) pairs into the model's adapters in place (cast to their dtype and
    device); exactly the adapter weights ``names`` must come, each once."""
    state = model.state_dict()
    expected, seen = set(names), set()
    for name, tensor in weights:
        if name not in expected:
            raise RuntimeError(f"LoRA weights: {name!r} is not an adapter weight of this model")
        state[name].copy_(tensor)
        seen.add(name)
    missing = sorted(expected - seen)
    if missing:
        raise RuntimeError(f"LoRA weights: {len(missing)} adapter weights did not come, e.g. {missing[:3]}")


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The base model's state dict with every adapted weight merged, W + (alpha / r) B A
    (peft's ``get_delta_weight``: gpt2's Conv1D transposed), under the plain model's names,
    on the CPU. The model itself is not changed."""
    from peft.tuners.lora import LoraLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    merged = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        if ".base_layer." in key:
            module, _, leaf = key.rpartition(".base_layer.")
            if leaf == "weight":
                value = value + layers[module].get_delta_weight(ADAPTER).to(value.dtype)
            key = f"{module}.{leaf}"
        merged[key] = value.detach().cpu().clone()
    return merged


def export_merged(model: torch.nn.Module, peft_model, folder: str | Path, dtype: torch.dtype) -> None:
    """``folder``: the merged model (a transformers folder, its weights in ``dtype``,
    ``workers.model_export``) and ``folder/adapter``: the adapters in peft's format."""
    folder = Path(folder)
    save_model(model, folder, dtype, merged_state_dict(model))
    peft_model.save_pretrained(str(folder / ADAPTER_FOLDER))


class Adapters:
    """One actor's adapters in its model (the trainer's or a replica's): injected at
    construction, read, loaded in place and exported; every method acts on that model."""

    def __init__(self, model: torch.nn.Module, lora: Mapping):
        self.model = model
        self.lora = dict(lora)
        self.peft_model = add_adapters(model, lora, int(lora.get("init_seed", 0)))
        self.names = adapter_names(model)

    def state(self) -> dict[str, torch.Tensor]:
        """The adapter weights (what a sync sends and a checkpoint keeps), as they are."""
        return adapter_state(self.model, self.names)

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        load_adapter_state(self.model, weights, self.names)

    def export(self, folder: str | Path, dtype: torch.dtype) -> None:
        export_merged(self.model, self.peft_model, folder, dtype)

    @contextlib.contextmanager
    def scoring(self):
        """The model in eval mode (adapter dropout off) for a no-grad scoring forward, as the
        replicas sample; back in train mode after."""
        if not self.model.training:
            yield
            return
        self.model.eval()
        try:
            yield
        finally:
            self.model.train()


def check_targets(path: str | Path, lora: Mapping, trust_remote_code: bool = False) -> None:
    """A ValueError naming ``lora.target_modules`` if peft finds none of them in the model at
    ``path`` (or has no default for its architecture); the model is built on the meta device,
    with no weights, so this costs well under a second."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    try:
        add_adapters(model, lora, 0)
    except ValueError as exc:  # peft's NoMatchingPeftModuleError is a ValueError
        raise ValueError(f"lora.target_modules {lora.get('target_modules')!r}: {exc}") from None


def write_peft_adapter(folder: str | Path, weights: Mapping[str, torch.Tensor], lora: Mapping) -> Path:
    """``weights`` (the synced adapter tensors, under the injected model's names) saved as a peft
    adapter folder (``adapter_config.json`` + ``adapter_model.safetensors``, peft's key names),
    which vLLM loads as a LoRA request. ``target_modules`` is written as the module names that
    have adapters (peft's default for the architecture resolved)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {"base_model.model." + name.replace(f".{ADAPTER}.", "."): tensor.detach().cpu().contiguous()
               for name, tensor in weights.items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    modules = sorted({name.split(".lora_")[0].rsplit(".", 1)[-1] for name in weights})
    config = _peft_config({**lora, "target_modules": modules})
    config.save_pretrained(str(folder))
    return folder


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM accepts."""


def vllm_max_rank(r: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds rank ``r``."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"models[].lora.r: {r} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}")
