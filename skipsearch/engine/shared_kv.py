"""The one KV cache that draft and verify share, its rollback and its length invariant.

Invariant (checked after every round, docs/theory.md, "The shared KV cache and rollback"): with a
sequence of `n` committed tokens (prompt + output), every layer holds the K/V of positions `0 ..
n-2` — length `n - 1`. The last committed token is *pending*: the next round feeds it (first draft
step, or the verify pass), which writes its K/V. Between rounds per-layer lengths differ (a draft
that skips a layer's attention writes nothing there), so lengths are set and checked layer by layer.

Two caches: a `DynamicCache` (eager decoding; lengths are tensor shapes, known on the host) and a
`StaticKV` (CUDA graphs; lengths live on the device, where the captured kernels read them). On the
static cache a per-layer crop or check would read each length back to the host — a device sync per
layer, ~100 per round at 32 layers — so its lengths are one device vector that `crop` clamps in
one kernel and `check_lengths` reads in one copy.

Rollback after a round: a chain's accepted drafts already sit after the pending token, so a `crop`
rolls it back; a token tree's accepted path sits in its nodes' slots, so `compact` moves it next to
the root first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, StaticLayer


class StaticKV(Cache):
    """Preallocated K/V of `max_len` positions per layer; every layer's length is `lengths[layer]`.

    Plain static layers for every layer, sliding-window ones included: a caller that keeps
    `max_len` within the window (`GraphSteps`) makes sliding attention full attention.
    """

    def __init__(self, config: Any, max_len: int, bucket: int, dtype: torch.dtype, device: torch.device):
        count = config.num_hidden_layers
        super().__init__(layers=[StaticLayer(max_cache_len=max_len) for _ in range(count)])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.early_initialization(bucket, config.num_key_value_heads, head_dim, dtype, device)
        self.lengths = torch.zeros(count, dtype=torch.long, device=device)
        for index, layer in enumerate(self.layers):
            layer.cumulative_length = self.lengths[index]  # a view: the layer's in-place updates land here


def layer_lengths(cache: DynamicCache | StaticKV) -> list[int]:
    """Every layer's length, read in one copy from a static cache."""
    if isinstance(cache, StaticKV):
        return cache.lengths.tolist()
    return [layer.get_seq_length() for layer in cache.layers]


def crop(cache: DynamicCache | StaticKV, length: int, layers: range | None = None) -> None:
    """Cut `layers` (default: all) back to at most `length` positions; shorter layers stay as they are.

    transformers >= 5 `crop(n)` takes minus the number of positions to remove (a positive
    argument, the absolute length of 4.x, raises), so the count is per layer. `crop(0)` is still
    called: it trims a sliding-window layer's recorded past back to the window. A static cache's
    lengths are clamped on the device, without reading them.
    """
    layers = range(len(cache.layers)) if layers is None else layers
    if isinstance(cache, StaticKV):
        cache.lengths[layers.start : layers.stop].clamp_(max=length)
        return
    for index in layers:
        layer = cache.layers[index]
        layer.crop(min(0, length - layer.get_seq_length()))


def check_lengths(cache: DynamicCache | StaticKV, expected: int) -> None:
    """Raise AssertionError unless every layer holds exactly `expected` positions."""
    lengths = layer_lengths(cache)
    wrong = {index: n for index, n in enumerate(lengths) if n != expected}
    if wrong:
        raise AssertionError(
            f"KV cache out of step: expected {expected} positions in every layer "
            f"(committed tokens - 1), got {wrong} (layer: length)"
        )


def compact(cache: DynamicCache | StaticKV, start: int, path: Sequence[int]) -> None:
    """Move the accepted nodes' K/V (slots `start + node`) to positions `start + 1 ..` in every
    layer, then cut every layer to `start + len(path) + 1`: a token tree's rollback.

    Only the nodes out of place move; a node's slot is never an earlier node's target, since the
    i-th node of a path is at least node i + 1. A DynamicCache moves them one position at a time (a
    view's copy: no gather, no clone); a static cache in one index copy a layer, its slots sent to
    the device once for the round, where a list index would send them once a layer.
    """
    moves = [(start + node, start + 1 + i) for i, node in enumerate(path) if node != i + 1]
    if moves and isinstance(cache, StaticKV):
        source, target = torch.tensor(list(zip(*moves, strict=True)), device=cache.lengths.device)
        for layer in cache.layers:
            for states in (layer.keys, layer.values):
                states.index_copy_(2, target, states.index_select(2, source))
    elif moves:
        for layer in cache.layers:
            for states in (layer.keys, layer.values):
                for source, target in moves:
                    states.select(2, target).copy_(states.select(2, source))
    crop(cache, start + len(path) + 1)
