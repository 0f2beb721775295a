"""What a `shared-kv` or `rounds` draft position attends to in the teacher-forced estimator
(`acceptance.estimator`; docs/theory.md, "Measuring acceptance" and "KV patterns").

`SharedKV` stands in for the cache: attention sees the full model's K/V of every position, then
the draft's own. Under a KV pattern with pillars (`kv.pillars`), `choose_pillars` runs each layer's
attention over the reference's states at every prediction position to choose the pillars as a
verify would, and `PillarMasks` builds each layer's mask from them when the runner reaches it.
"""

from __future__ import annotations

from typing import Any

import torch

from skipsearch.acceptance.reference import ReferenceCache
from skipsearch.kv.pillars import PillarChoice
from skipsearch.masks import KVPattern
from skipsearch.models.runner import LayerwiseRunner


class SharedKV:
    """Cache stand-in for the `shared-kv` and `rounds` estimators: attention sees the full model's
    K/V for all positions followed by the draft's own; the estimator's mask picks, per query, the
    full K/V before its round and its own K/V from its round's start to itself (in `shared-kv`
    every query is a round of its own: the first draft step of a round)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.cat([self.keys[layer_idx], key_states], dim=2),
            torch.cat([self.values[layer_idx], value_states], dim=2),
        )


def choose_pillars(
    runner: LayerwiseRunner,
    reference: ReferenceCache,
    kv: KVPattern,
    rows: slice,
    position_ids: torch.Tensor,
    cache: SharedKV,
) -> PillarChoice:
    """The pillars the full model chooses at every prediction position of `rows` (`[b, Q, KV,
    K]` per layer): each layer's attention run over the reference's states at those positions,
    recording (`kv.pillars`)."""
    width, queries = cache.keys.shape[-2], position_ids.shape[1]
    seen = torch.arange(width, device=runner.device)[None, None] <= position_ids[..., None]
    hidden_size = reference.hidden.shape[-1]
    blind = torch.zeros(*seen.shape[:2], queries, dtype=torch.bool, device=runner.device)
    mask = torch.cat([seen, blind], dim=2)[:, None]
    choice = PillarChoice(kv, position_ids, runner.num_layers, runner.config.num_key_value_heads)
    index = position_ids[..., None].expand(-1, -1, hidden_size)
    embeddings = runner.rotary(reference.hidden[0, rows, :1], position_ids)
    for layer in range(runner.num_layers):
        hidden = reference.hidden[layer, rows].gather(1, index)
        runner.attention(layer, hidden, embeddings, mask, cache, pillars=choice, own_mask=True)
    return choice


class PillarMasks:
    """The `shared-kv` attention masks of a draft with pillars, one per layer (built when the
    runner reaches the layer): each query sees, beside its band of the reference (`earlier`
    `[b, Q, N]`) and its round's own K/V (`own` `[b, Q, Q]`), the pillars its round's source
    query chose in that layer (`chosen`, at `sources` `[b, Q]`), per K/V head, so per query head."""

    def __init__(
        self,
        earlier: torch.Tensor,
        own: torch.Tensor,
        chosen: PillarChoice,
        sources: torch.Tensor,
        config: Any,
    ) -> None:
        self.earlier, self.own, self.chosen, self.sources = earlier, own, chosen, sources
        self.group = config.num_attention_heads // config.num_key_value_heads

    def __getitem__(self, layer: int) -> torch.Tensor:
        positions, valid = self.chosen.layer_choice(layer)
        batch, queries, width = self.earlier.shape
        index = self.sources.clamp(min=0)[..., None, None].expand(-1, -1, *positions.shape[2:])
        keys = positions.gather(1, index).transpose(1, 2)  # [b, KV, Q, K]
        real = (valid.gather(1, index) & (self.sources >= 0)[..., None, None]).transpose(1, 2)
        # the choice also scored the round's own keys: never real pillars, but a narrow region's
        # unreal picks may land there
        pillars = torch.zeros(
            batch, keys.shape[1], queries, width + queries, dtype=torch.bool, device=keys.device
        )
        pillars.scatter_(3, keys, real)
        seen = self.earlier[:, None] | pillars[..., :width].repeat_interleave(self.group, dim=1)
        own = self.own[:, None].expand(-1, seen.shape[1], -1, -1)
        return torch.cat([seen, own], dim=3)
