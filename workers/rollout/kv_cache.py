"""A KV cache that appends in place, for long responses on the ``hf`` generation backend.

transformers' ``DynamicLayer`` appends each new token with ``torch.cat([keys, new])``: every
decoding step copies the layer's whole cache, so sampling L tokens after a P-token prompt copies
sum_{t<L} (P + t) positions per row and layer, O(L^2) bytes moved besides the attention itself
(at 1,024 new tokens on the 13.7 M benchmark model that is ~2 GB per step). ``GrowingLayer``
keeps its keys and values in a buffer with spare room, reserved once for the whole response
(``capacity``: prompt + max_new_tokens), and writes each step's keys and values into it in
place; what attention sees, ``keys`` / ``values``, is the buffer's first ``length`` positions
(a view, no copy). Values are the same numbers either way: only where they are stored differs.

The prompt's prefill is held as it comes (no buffer yet); the buffer is reserved, and the
prompt copied into it once, at the first append, or by ``batch_repeat_interleave``, which copies
each prompt's rows straight into the n samples' buffer. Anything else that replaces ``keys``
with a tensor of its own (``batch_select_indices``, a cache built from data) is adopted into a
fresh buffer at the next ``update``; ``crop`` keeps a view of the buffer, so later tokens
overwrite the cropped ones.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """``DynamicLayer`` whose appends write in place into a buffer of ``capacity`` positions
    (doubled when a longer sequence arrives)."""

    def __init__(self, capacity: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.capacity = capacity
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def _owns_keys(self) -> bool:
        """``keys`` is still a prefix view of the buffer (not a tensor something else put there)."""
        buffer = self._key_buffer
        return (buffer is not None and self.keys is not None and self.keys.numel() > 0
                and self.keys.data_ptr() == buffer.data_ptr() and self.keys.shape[:2] == buffer.shape[:2])

    def _reserve(self, key_states: torch.Tensor, value_states: torch.Tensor, length: int, needed: int) -> None:
        """A fresh buffer of ``capacity`` positions, or where ``needed`` is more, of at least twice
        the current ``length``, holding the current ``length`` ones (a reservation no larger than
        ``capacity`` while the response fits it: ``workers.rollout.kv_budget`` counts on it)."""
        room = self.capacity if needed <= self.capacity else max(needed, 2 * length)
        keys = key_states.new_empty((*key_states.shape[:2], room, key_states.shape[-1]))
        values = value_states.new_empty((*value_states.shape[:2], room, value_states.shape[-1]))
        if length:
            keys[..., :length, :].copy_(self.keys)
            values[..., :length, :].copy_(self.values)
        self._key_buffer, self._value_buffer = keys, values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.get_seq_length()
        if length == 0:  # the prefill: held as it came; the buffer comes with the first append
            self.keys, self.values = key_states, value_states
            return self.keys, self.values
        needed = length + key_states.shape[-2]
        if not self._owns_keys() or needed > self._key_buffer.shape[-2]:
            self._reserve(key_states, value_states, length, needed)
        self._key_buffer[..., length:needed, :].copy_(key_states)
        self._value_buffer[..., length:needed, :].copy_(value_states)
        self.keys = self._key_buffer[..., :needed, :]
        self.values = self._value_buffer[..., :needed, :]
        return self.keys, self.values

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Row i's cache to rows i*repeats .. i*repeats + repeats - 1, copied once, straight into
        a buffer with the reserved room (``DynamicLayer``'s repeat, then an adoption at the next
        append, would copy it twice)."""
        length = self.get_seq_length()
        if length == 0:
            return
        room = max(length, self.capacity)
        buffers = []
        for states in (self.keys, self.values):
            batch, heads, _, dim = states.shape
            buffer = states.new_empty((batch * repeats, heads, room, dim))
            buffer.view(batch, repeats, heads, room, dim)[..., :length, :].copy_(states[:, None])
            buffers.append(buffer)
        self._key_buffer, self._value_buffer = buffers
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


def growing_cache(config, capacity: int) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers are ``GrowingLayer`` of
    ``capacity`` positions (sliding-window and other special layers stay as transformers makes
    them)."""
    cache = DynamicCache(config=config)
    cache.layers = [GrowingLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
