"""The kernel plan's KV cache: K/V appended in place, in the dtype the plan's attention reads.

transformers' `DynamicLayer` appends with `torch.cat`, which copies the layer's whole cache on every
step; beside the fp32 attention path the cache must also hold float32 K/V whatever the projections'
dtype. `models.kernels.new_cache` builds the cache a model's plan wants.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

MIN_CAPACITY = 256  # positions a layer's buffers start with


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer whose K/V live in buffers that grow by doubling.

    transformers' `DynamicLayer` appends with `torch.cat`, which copies the whole cache of the layer
    on every step: at 8k positions that copy cost SmolLM2 more than its attention kernels
    (docs/cpu-backend.md, "The KV cache"). Here an append writes only the new positions, in the
    buffer's dtype (`kv_dtype`, or the first update's), and `keys`/`values` are views of the
    filled part; a crop only shortens the views, so positions rolled back are overwritten by the
    next append — the cache discipline of the SSD engine.
    """

    def __init__(self, kv_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.kv_dtype = kv_dtype
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        dtype = self.kv_dtype or key_states.dtype
        self._keys = key_states.new_empty((*key_states.shape[:2], 0, key_states.shape[3]), dtype=dtype)
        self._values = value_states.new_empty(
            (*value_states.shape[:2], 0, value_states.shape[3]), dtype=dtype
        )
        self.length = 0
        self._expose()
        self.is_initialized = True

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def _reserve(self, needed: int) -> None:
        capacity = self._keys.shape[2]
        if needed <= capacity:
            return
        capacity = max(needed, 2 * capacity, MIN_CAPACITY)
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            grown = old.new_empty((*old.shape[:2], capacity, old.shape[3]))
            grown[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, grown)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[2]
        self._reserve(end)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def claim(self, rows: int) -> int:
        """Room for `rows` new positions after the cached ones, which the caller writes into
        `buffers` at `[start, start + rows)` (the fused decoder layers, `cpu.fused_layers`,
        write rotated keys straight there); returns `start`. The layer must be initialized."""
        start = self.length
        self._reserve(start + rows)
        self.length = start + rows
        self._expose()
        return start

    @property
    def buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The key and value buffers `[b, KV, capacity, D]`, of which `keys`/`values` are the filled part."""
        return self._keys, self._values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """`tokens_to_remove` <= 0 positions off the end, as transformers >= 5 crops."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of positions to remove, got {tokens_to_remove}")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

    def reset(self) -> None:
        self.length = 0
        super().reset()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.get_seq_length() > 0:
            self._keys, self._values = (
                self.keys.repeat_interleave(repeats, 0),
                self.values.repeat_interleave(repeats, 0),
            )
            self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._keys, self._values = self.keys[indices].contiguous(), self.values[indices].contiguous()
            self._expose()


class PlanKVCache(DynamicCache):
    """The KV cache of the kernel plan: full-attention layers grow in place (`GrowingLayer`) in
    `kv_dtype` (float32 beside the fp32 attention path; None keeps the projections' dtype), and
    sliding-window layers stay transformers' own, fed `kv_dtype` too."""

    def __init__(self, config: Any, kv_dtype: torch.dtype | None = None) -> None:
        super().__init__(config=config)
        self.kv_dtype = kv_dtype
        self.layers = [
            GrowingLayer(kv_dtype) if type(layer) is DynamicLayer else layer for layer in self.layers
        ]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kv_dtype is not None:
            key_states, value_states = key_states.to(self.kv_dtype), value_states.to(self.kv_dtype)
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)
