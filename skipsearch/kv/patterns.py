"""Attention over a draft's KV pattern: the sink and the window of the cache, read where they lie
(docs/theory.md, "KV patterns").

A draft step with `KVPattern(sink, window)` attends to the cache's first `sink` positions and
the last `window` up to its own. Both are slices of the cache's buffers, so the step reads
`sink + window` keys whatever the context (upcast to float32, the plan's attention arithmetic; the
rest of the cache is never touched): the scores of the two slices are computed apart, concatenated
(a few thousand floats a head) and normalised together, which is the softmax over their union. A
query block of several positions (the estimator's teacher-forced passes) gets each query's own
window through a band mask over the union of their windows.

Over a static cache (`engine.shared_kv.StaticKV`: the CUDA graphs' buffers, whose slots beyond the
length are stale) the window cannot be a slice, as a captured graph's slices are fixed while its
position moves on the device: `static_pattern_attention` gathers the window's `window` slots from
the step's device-held position (`StaticKeys`) into a buffer of fixed size, beside the sink's
first `sink` slots, and masks what the union does not hold (a slot past the position, or one of
the window's that the sink holds already) — the same keys as `pattern_attention`, so the same
tokens, at `sink + window` keys read at every replay.

The plan's attention functions (`models.attention`) call `pattern_attention` when the layer runs a
draft step with a pattern (the `kv_pattern` keyword, passed through transformers' attention
modules) and the pattern leaves some key out; otherwise the full attention runs, so a draft whose
window still covers the context is exactly the full model. The decode kernel's plan reads the
pattern inside the kernel instead (`cpu.decode_attention`), for blocks short enough for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skipsearch.masks import KVPattern

KV_PATTERN_KEYWORD = "kv_pattern"
# Set where the attention mask is the caller's own (the estimator's rounds and bands), not the causal
# mask of a cache: the decode kernel, which reads causality from positions, must not stand in for it.
OWN_MASK_KEYWORD = "own_attention_mask"


def pattern_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    pattern: KVPattern,
    scaling: float,
    pillars: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | None:
    """Attention output `[b, M, H, D]` (transformers' layout) of `query` `[b, H, M, D]` over the
    pattern's keys of `key`/`value` `[b, KV, N, D]` (the cache, the queries' own positions last)
    and the round's `pillars` (keys and values `[b, KV, K, D]`, seen by every query;
    `kv.pillars`), in float32 (the keys upcast, as the plan's other paths compute); None when
    every query sees every key."""
    batch, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if pattern.covers(length):  # the last query, whose window starts latest, sees every key
        return None
    first = length - queries  # position of the first query
    window_start = max(pattern.sink, first + 1 - pattern.window)
    group = heads // kv_heads
    # Queries of one K/V head side by side: [b, KV, group * M, D], head-major as SDPA's GQA groups them.
    grouped = query.float().reshape(batch, kv_heads, group * queries, dim)
    sink_keys, sink_values = key[:, :, : pattern.sink].float(), value[:, :, : pattern.sink].float()
    window_keys, window_values = key[:, :, window_start:].float(), value[:, :, window_start:].float()
    if pillars is not None:  # beside the sink: each part's scores stay one slice of the union
        sink_keys = torch.cat([sink_keys, pillars[0].float()], dim=2)
        sink_values = torch.cat([sink_values, pillars[1].float()], dim=2)
    before = sink_keys.shape[2]
    scores = torch.cat(
        [grouped @ sink_keys.transpose(-1, -2), grouped @ window_keys.transpose(-1, -2)], dim=-1
    )
    scores.mul_(scaling)
    if queries > 1:  # query i at `first + i` sees the window keys in [first + i + 1 - window, first + i]
        absolute = torch.arange(window_start, length, device=key.device)
        at = torch.arange(first, length, device=key.device)[:, None]
        outside = (absolute > at) | ~pattern.sees(absolute, at)
        scores[..., before:].masked_fill_(outside.repeat(group, 1), float("-inf"))
    weights = scores.softmax(dim=-1)
    out = weights[..., :before] @ sink_values + weights[..., before:] @ window_values
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous().to(query.dtype)


@dataclass(frozen=True)
class StaticKeys:
    """A one-position draft step's KV pattern over a static cache: the pattern, and the step's
    position `[1, 1]` on the device (the graph's input buffer, read at every replay)."""

    pattern: KVPattern
    position: torch.Tensor


def static_pattern_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, keys: StaticKeys, scaling: float
) -> torch.Tensor:
    """Attention output `[b, 1, H, D]` of a one-position `query` `[b, H, 1, D]` over the pattern's
    keys of a static cache's `key`/`value` `[b, KV, slots, D]`, in float32 as `pattern_attention`:
    the sink's slots and the window's gathered from the device-held position, each of fixed size."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    device = key.device
    sink = min(keys.pattern.sink, key.shape[2])
    position = keys.position.reshape(1)
    window = position + 1 - keys.pattern.window + torch.arange(keys.pattern.window, device=device)
    sink_slots = torch.arange(sink, device=device)
    # The union of the sink and the window up to the position: a window slot the sink holds (or one
    # before the first) is masked, as is a sink slot past the position.
    seen = torch.cat([sink_slots <= position, (window >= sink) & (window >= 0)])
    gathered = window.clamp(min=0)
    keys_read = torch.cat([key[:, :, :sink], key.index_select(2, gathered)], dim=2).float()
    values_read = torch.cat([value[:, :, :sink], value.index_select(2, gathered)], dim=2).float()
    grouped = query.float().reshape(batch, kv_heads, heads // kv_heads * queries, dim)
    scores = (grouped @ keys_read.transpose(-1, -2)).mul_(scaling)
    scores.masked_fill_(~seen, float("-inf"))
    out = scores.softmax(dim=-1) @ values_read
    return out.reshape(batch, heads, queries, dim).transpose(1, 2).contiguous().to(query.dtype)
