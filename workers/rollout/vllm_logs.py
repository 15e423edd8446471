"""vLLM's warnings on every weight sync that report no failure.

vLLM 0.32 reloads a replica's weights in place layer by layer (``reload_weights``, which every
sync calls): each module's tensors are put on the meta device, refilled from the weights sent,
and copied back into the engine's own storage. A module that owns no tensor a checkpoint fills
receives nothing, so vLLM puts its tensors back as they were and logs, on every sync,

    WARNING ... [layerwise.py] RotaryEmbedding: Failed to load weights
    WARNING ... [layerwise.py] ParallelLMHead: Failed to load weights

(``finalize_layerwise_processing``). Such modules are of two kinds: those holding buffers only
(the rotary embedding's ``cos_sin_cache``, computed from the config at start-up) and those whose
parameters are another module's (a tied LM head, Llama 3.2's: its ``weight`` is the embedding's,
refilled when the embedding is). On the GPU template that is one or two lines per step per
replica in the job's output saying a sync failed where nothing did.
:func:`quiet_weightless_reload_warnings` drops that line for those classes only; a module owning a
parameter that a sync leaves out is still warned about (the tied embedding's own owner included),
and vLLM's "Following weights were not loaded" list is untouched.
"""

from __future__ import annotations

import logging

LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
FAILED = "%s: Failed to load weights"


def weightless_classes(model) -> list[str]:
    """Class names of ``model``'s modules that own no parameter: buffers only, or parameters that
    an earlier module holds (tied); less any class with a module that owns one. A parameter held by
    several modules is owned by the first (``model.modules()`` order), the one ``named_parameters()``
    names it after and vLLM's loaders fill: a tied embedding owns its weight, the LM head does not."""
    owner: dict[int, int] = {}  # a parameter's id -> the id of the first module holding it
    for module in model.modules():
        for param in module.parameters(recurse=False):
            owner.setdefault(id(param), id(module))
    weightless, owning = set(), set()
    for module in model.modules():
        name = type(module).__name__
        own = [p for p in module.parameters(recurse=False) if owner[id(p)] == id(module)]
        if own:
            owning.add(name)
        elif next(module.parameters(recurse=False), None) is not None or next(module.buffers(recurse=False), None) is not None:
            weightless.add(name)
    return sorted(weightless - owning)


class WeightlessReloadFilter(logging.Filter):
    """Drops vLLM's "<class>: Failed to load weights" for the given classes."""

    def __init__(self, classes: list[str]):
        super().__init__()
        self.classes = frozenset(classes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == FAILED and bool(record.args) and record.args[0] in self.classes)


def quiet_weightless_reload_warnings(llm) -> WeightlessReloadFilter | None:
    """Install the filter on vLLM's layerwise-reload logger for ``llm``'s model (its workers' modules,
    read with ``LLM.apply_model``); returns it, or None where the model cannot be read from here (an
    engine core in a process of its own that refuses the function): the warnings then stay."""
    try:
        found = llm.apply_model(weightless_classes)
    except Exception:  # noqa: BLE001 - a log line's filter never stops an engine from starting
        return None
    quiet = WeightlessReloadFilter(sorted({name for names in found for name in names}))
    logging.getLogger(LAYERWISE_LOGGER).addFilter(quiet)
    return quiet
