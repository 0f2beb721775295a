"""Pillars: keys beyond a draft's sink and window, chosen from the full model's own attention
(SparseSpec's PillarAttn; docs/theory.md, "KV patterns").

A sink + window draft forgets whatever the text said between the two. Its verify, though, attends to
every key, and the keys it weighs most are the ones a next position is likely to need too. So the
verify's first position (the round's pending token, always committed) hands each layer and K/V head
the `pillars` keys with the largest attention mass (softmax per query head, summed over the heads
that share the K/V head) among those past the sink and before any later draft position's window
(`KVPattern.pillar_region`), and the next round's draft steps attend to them beside sink and window.
The first round of a decode follows no verify and drafts with sink and window alone.

The rule is causal and needs nothing the draft does not have: pillars come from a pass that already
ran, never from the draft position's own scores (which would be an oracle). The estimator applies
the same rule to the reference's full-model queries (`acceptance.estimator`), so it scores what the
engine drafts.

- `PillarChoice` collects the choice layer by layer while a verify (or the estimator's pass over
  the reference) runs: the decode kernel writes query 0's scores as it attends
  (`cpu.decode_attention`), other paths compute them from the query and keys.
- `PillarKeys` holds a round's pillars gathered out of the cache once, for every draft step of the
  round; the attention functions read them beside the pattern's band.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from skipsearch.masks import KVPattern

PILLAR_KEYWORD = "pillar_choice"  # the attention keyword a PillarChoice travels under


def choose_pillars(
    scores: torch.Tensor, sources: torch.Tensor, pattern: KVPattern, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pillars that query rows choose: `scores` `[b, H, M, N]` (scaled, -inf at keys a row does
    not see) of the rows at positions `sources` `[b, M]` -> (key positions `[b, M, KV, K]`, whether
    each is real `[b, M, KV, K]`: a region narrower than K yields fewer)."""
    batch, heads, rows, keys = scores.shape
    mass = scores.float().softmax(-1).view(batch, kv_heads, heads // kv_heads, rows, keys).sum(2)
    begin, end = pattern.pillar_region(sources)
    at = torch.arange(keys, device=scores.device)
    inside = (at >= begin) & (at < end[..., None])  # [b, M, N]
    mass = mass.masked_fill(~inside[:, None], -1.0)
    top = mass.topk(min(pattern.pillars, keys), dim=-1)
    return top.indices.transpose(1, 2), (top.values >= 0).transpose(1, 2)


def query_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    scale: float,
    attention_mask: torch.Tensor | None = None,
    rows: int | None = None,
) -> torch.Tensor:
    """Scaled scores `[b, H, M, N]` of `query` `[b, H, M, D]` (its first `rows` rows when given)
    against `key` `[b, KV, N, D]`, -inf where `attention_mask` (bool or additive, broadcastable to
    `[b, H, M, N]`) or, without one, causality hides a key; in float32, as the plan's attention."""
    batch, heads, queries, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    taken = queries if rows is None else rows
    grouped = query[:, :, :taken].float().reshape(batch, kv_heads, heads // kv_heads * taken, dim)
    scores = (grouped @ key.float().transpose(-1, -2)).view(batch, heads, taken, length) * scale
    if attention_mask is None:
        at = torch.arange(length, device=key.device)
        hidden = at[None] > (length - queries + torch.arange(taken, device=key.device))[:, None]
        return scores.masked_fill(hidden, float("-inf"))
    mask = attention_mask[..., :taken, :]
    if mask.dtype == torch.bool:
        return scores.masked_fill(~mask, float("-inf"))
    return scores + mask.float()


class PillarChoice:
    """The pillars chosen while a full-model pass runs, layer by layer.

    `sources` `[b, M]`: the positions of the rows that choose (the engine's verify: its first
    position, `rows=1`; the estimator: every prediction position). `layer_choice(l)` gives layer
    `l`'s choice, positions and whether each is real (`[b, M, KV, K]`; None for a layer that did not
    run attention). A one-row choice (a verify's) keeps each layer's scores until the pass ends and
    chooses for every layer in one batched call, sorting every layer's first row with it: per
    layer, the few small operations cost more in calls than in arithmetic (about 15 ms a verify of
    SmolLM2 at 8k tokens, batched about 2).
    """

    def __init__(self, pattern: KVPattern, sources: torch.Tensor, layers: int, kv_heads: int) -> None:
        self.pattern = pattern
        self.sources = sources
        self.rows = sources.shape[1]
        self.kv_heads = kv_heads
        self._chosen: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers
        self._pending: dict[int, torch.Tensor] = {}
        self._first_rows: dict[int, torch.Tensor | None] = {}  # `first_row`s of a batched choice

    def record(self, layer: int, scores: torch.Tensor) -> None:
        """Layer `layer`'s scores `[b, H, M, N]` of the choosing rows."""
        if scores.shape[0] == 1 and self.rows == 1:
            self._pending[layer] = scores
        else:
            self._chosen[layer] = choose_pillars(scores, self.sources, self.pattern, self.kv_heads)

    def layer_choice(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        by_length: dict[int, list[int]] = {}
        for pending, scores in self._pending.items():  # layers whose caches differ in length apart
            by_length.setdefault(scores.shape[-1], []).append(pending)
        for layers in by_length.values():
            scores = torch.cat([self._pending[pending] for pending in layers])
            sources = self.sources.expand(len(layers), -1)
            positions, valid = choose_pillars(scores, sources, self.pattern, self.kv_heads)
            # Every layer's first row in one sort: real pillars ascending, the rest pushed past them.
            ordered = positions.masked_fill(~valid, scores.shape[-1]).sort(-1).values
            counts = valid[:, 0, 0].sum(-1).tolist()  # every head of a row sees the same region
            for index, chosen in enumerate(layers):
                self._chosen[chosen] = positions[index : index + 1], valid[index : index + 1]
                self._first_rows[chosen] = ordered[index, 0, :, : counts[index]] if counts[index] else None
        self._pending = {}
        return self._chosen[layer]

    def first_rows(self) -> list[torch.Tensor | None]:
        """Every layer's `first_row`: what the next round's draft gathers (`PillarKeys.gather`)."""
        return [self.first_row(layer) for layer in range(len(self._chosen))]

    def first_row(self, layer: int) -> torch.Tensor | None:
        """Layer `layer`'s pillars of the first row of a one-sequence pass, `[KV, K']` ascending
        (K' < K where the region was narrower), or None when it chose none."""
        chosen = self.layer_choice(layer)
        if layer in self._first_rows:
            return self._first_rows[layer]
        if chosen is None:
            return None
        positions, valid = chosen
        count = int(valid[0, 0, 0].sum())  # every head of a row sees the same region
        return positions[0, 0, :, :count].sort(-1).values if count else None


@dataclass(frozen=True)
class PillarKeys:
    """A round's draft reads: the KV pattern, and per layer the pillars' keys and values gathered
    out of the cache (`[1, KV, K', D]`, contiguous; None where a layer has none)."""

    pattern: KVPattern
    keys: Sequence[torch.Tensor | None]
    values: Sequence[torch.Tensor | None]

    @classmethod
    def gather(
        cls, pattern: KVPattern, positions: Sequence[torch.Tensor | None], cache: object
    ) -> PillarKeys:
        """The keys and values at `positions` (per layer `[KV, K']`) of `cache`'s layers."""
        keys: list[torch.Tensor | None] = []
        values: list[torch.Tensor | None] = []
        heads = None  # each K/V head's row index, the same for every layer
        for layer, chosen in enumerate(positions):
            if chosen is None:
                keys.append(None)
                values.append(None)
                continue
            stored = cache.layers[layer]
            # Indexing whole rows: `gather` with the index expanded over the head dimension cost
            # 80-95 us a call on the growing cache's views, 60 calls a round (5-6 ms on SmolLM2).
            if heads is None:
                heads = torch.arange(chosen.shape[0], device=chosen.device)[:, None]
            keys.append(stored.keys[0, heads, chosen][None])
            values.append(stored.values[0, heads, chosen][None])
        return cls(pattern, keys, values)

    def of_layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        keys = self.keys[layer] if layer < len(self.keys) else None
        return None if keys is None else (keys, self.values[layer])
