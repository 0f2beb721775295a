"""What a space file says, before it meets a model: `SpaceSpec` and `TierSpec`
(docs/architecture.md, "Search spaces").

Layer indices and skip counts may be written as fractions of depth so that one file serves every
model: a fraction `f` of `n` items is `min(floor(f * n), n - 1)` for a layer index (0.5 -> L // 2,
1.0 -> the last layer), and a negative integer counts from the end (-1 is the last layer).
`SpaceSpec.resolve(num_layers)` turns a spec into a `ConcreteSpace` for one model. The `r_draft`
bounds of a file are by sub-layer count, not by measured latency, so a file means the same on every
device; the cost model weighs the masks it finds. So do they for a space with a precision
dimension (`precision`): they count skipped units only, and the cost model prices the bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from skipsearch.errors import ConfigError
from skipsearch.masks import FULL_BITS, KVPattern
from skipsearch.search.spaces import BlockSpace, ConcreteSpace, ContiguousSpace
from skipsearch.search.subset_spaces import MixedSpace, SubsetSpace
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tree_shapes import Tree

# Float slack when turning r_draft bounds into skip counts, so 1 - 6/12 <= 0.5 holds.
EPS = 1e-9

LayerRef = int | float
"""A layer index (negative counts from the end) or a fraction of depth in [0, 1]."""


# -- specs (what a file says) ------------------------------------------------------------------
@dataclass(frozen=True)
class SpaceSpec:
    """A validated mask space file, independent of depth; `resolve` fits it to a model."""

    name: str
    kind: str
    source: str
    description: str
    protected: tuple[LayerRef, ...]
    r_draft_min: float
    r_draft_max: float
    min_skipped: LayerRef
    max_skipped: LayerRef | None
    gamma_min: int
    gamma_max: int
    draft_vocab: tuple[int | None, ...] = (None,)
    kv: tuple[KVPattern | None, ...] = (None,)
    tree: tuple[Tree, ...] = ()  # token-tree shapes each draft is also scored as (none: chains only)
    # bits the draft's kept sub-layers may read their weights at: one for all of them, or (mixed)
    # one per sub-layer
    precision: tuple[int, ...] = (FULL_BITS,)

    def _layer(self, ref: LayerRef, num_layers: int) -> int:
        if isinstance(ref, float):
            return min(math.floor(ref * num_layers + EPS), num_layers - 1)
        if not -num_layers <= ref < num_layers:
            raise space_error(
                self.source,
                "protected",
                f"layer {ref} is out of range for a model with {num_layers} layers",
                f"use indices -{num_layers}..{num_layers - 1} or a fraction of depth such as 0.5",
            )
        return ref % num_layers

    def resolve(self, num_layers: int) -> ConcreteSpace:
        """The concrete space at `num_layers`; a ConfigError naming the binding keys when no mask
        meets every constraint."""
        protected = frozenset(self._layer(ref, num_layers) for ref in self.protected)
        sublayer = self.kind in ("sublayer", "mixed")
        units = 2 * num_layers if sublayer else num_layers
        unit = "sub-layer" if sublayer else "layer"
        if self.kind == "contiguous":
            free = num_layers - 1 - max(protected, default=0)
        elif self.kind == "block":
            free = BlockSpace.longest_run(num_layers, protected)
        else:
            free = units - (2 if sublayer else 1) * len(protected)
        lows = [
            (_count(self.min_skipped, units), "min_skipped"),
            (math.ceil((1 - self.r_draft_max) * units - EPS), "r_draft_max"),
        ]
        highs = [
            (math.floor((1 - self.r_draft_min) * units + EPS), "r_draft_min"),
            (free, "protected"),
        ]
        if self.max_skipped is not None:
            highs.append((_count(self.max_skipped, units), "max_skipped"))
        low, low_key = max(lows)
        high, high_key = min(highs)
        if low > high:
            why = f"{high_key}={getattr(self, high_key)}"
            if high_key == "protected":
                why = f"protected={sorted(protected)} ({free} skippable {unit}s)"
            raise space_error(
                self.source,
                f"{low_key}/{high_key}",
                f"no mask is feasible at {num_layers} layers: {low_key}={getattr(self, low_key)} needs "
                f"at least {low} skipped {unit}s, but {why} allows at most {high}",
                f"{_RELAX[low_key]} or {_RELAX[high_key]}",
            )
        cls = {"contiguous": ContiguousSpace, "block": BlockSpace, "mixed": MixedSpace}.get(
            self.kind, SubsetSpace
        )
        extra = {"sublayer": sublayer} if cls is SubsetSpace else {}
        return cls(
            name=self.name,
            num_layers=num_layers,
            protected=protected,
            min_skipped=low,
            max_skipped=high,
            gamma_min=self.gamma_min,
            gamma_max=self.gamma_max,
            precisions=self.precision,
            **extra,
        )


_RELAX = {
    "min_skipped": "lower min_skipped",
    "r_draft_max": "raise r_draft_max",
    "r_draft_min": "lower r_draft_min",
    "max_skipped": "raise max_skipped",
    "protected": "protect fewer layers",
}


def space_error(source: str, key: str, problem: str, fix: str) -> ConfigError:
    """`search space FILE, key 'KEY': PROBLEM: FIX` (the key part only when there is one)."""
    where = f", key '{key}'" if key else ""
    return ConfigError(f"search space {source}{where}: {problem}: {fix}")


def _count(ref: LayerRef, units: int) -> int:
    return math.floor(ref * units + EPS) if isinstance(ref, float) else ref


@dataclass(frozen=True)
class TierSpace:
    """K masks from `base` plus the policy that switches between them (scored elsewhere)."""

    name: str
    base: ConcreteSpace
    num_tiers: int
    policy: TierPolicy


@dataclass(frozen=True)
class TierSpec:
    """A validated tiers file: `num_tiers` masks drawn from the `base` space, and a policy."""

    name: str
    source: str
    description: str
    base: SpaceSpec
    num_tiers: int
    policy: TierPolicy

    def resolve(self, num_layers: int) -> TierSpace:
        base = self.base.resolve(num_layers)
        if base.size() < self.num_tiers:
            raise space_error(
                self.source,
                "num_tiers",
                f"{self.num_tiers} tiers need as many distinct masks but base space {self.base.source} "
                f"has {base.size()} at {num_layers} layers",
                "lower num_tiers or widen the base space",
            )
        return TierSpace(self.name, base, self.num_tiers, self.policy)
