"""Subset spaces: any subset of the free units (`sparse`: whole layers, `sublayer`: attention and
MLP apart), and the `mixed` space that also chooses each kept sub-layer's precision (docs/theory.md,
"Drafts at lower precision").

A subset of `k` of `n` free units is one of C(n, k), so counting, exact uniform sampling and
enumeration stay closed forms (`spaces.ConcreteSpace` does the rest).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import optuna

from skipsearch.errors import InvalidMaskError
from skipsearch.masks import SkipMask
from skipsearch.search.space_precision import PRECISIONS, SKIP, mask_from_bits, precision_name, skips_of
from skipsearch.search.spaces import ConcreteSpace


@dataclass(frozen=True)
class Unit:
    """One free unit of a subset space: a whole layer (sparse) or one of its sub-layers."""

    layer: int
    attn: bool
    mlp: bool

    @property
    def param(self) -> str:
        if self.attn and self.mlp:
            return f"skip_{self.layer}"
        return f"{'attn' if self.attn else 'mlp'}_{self.layer}"


@dataclass(frozen=True)
class SubsetSpace(ConcreteSpace):
    """Any subset of the free units (`sparse`: layers, `sublayer`: attention and MLP apart).

    Each free unit is one Optuna int param in {0, 1} (`skip_<l>`, or `attn_<l>` / `mlp_<l>`): ints
    rather than categoricals because CMA-ES and GP model ints, while CMA-ES samples categoricals
    at random.
    """

    sublayer: bool = False

    @property
    def kind(self) -> str:
        return "sublayer" if self.sublayer else "sparse"

    @property
    def units_total(self) -> int:
        return 2 * self.num_layers if self.sublayer else self.num_layers

    @cached_property
    def units(self) -> tuple[Unit, ...]:
        free = [layer for layer in range(self.num_layers) if layer not in self.protected]
        if not self.sublayer:
            return tuple(Unit(layer, True, True) for layer in free)
        return tuple(Unit(layer, part == "attn", part == "mlp") for layer in free for part in ("attn", "mlp"))

    def _mask(self, chosen: Sequence[Unit]) -> SkipMask:
        return SkipMask(
            self.num_layers,
            frozenset(u.layer for u in chosen if u.attn),
            frozenset(u.layer for u in chosen if u.mlp),
        )

    def _chosen(self, mask: SkipMask) -> list[Unit] | None:
        chosen = [
            u
            for u in self.units
            if (not u.attn or u.layer in mask.attn) and (not u.mlp or u.layer in mask.mlp)
        ]
        return chosen if self._mask(chosen) == mask else None

    def skip_count(self, mask: SkipMask) -> int | None:
        chosen = self._chosen(mask)
        return None if chosen is None else len(chosen)

    def _count_with(self, k: int) -> int:
        return math.comb(len(self.units), k)

    def _random_with(self, k: int, rng: np.random.Generator) -> SkipMask:
        units = self.units
        return self._mask([units[i] for i in rng.choice(len(units), size=k, replace=False)])

    def _evenly_spaced_with(self, k: int) -> SkipMask:
        units = self.units
        return self._mask([units[int((i + 0.5) * len(units) / k)] for i in range(k)])

    def _all_with(self, k: int) -> Iterator[SkipMask]:
        return (self._mask(chosen) for chosen in itertools.combinations(self.units, k))

    def _suggest_skips(self, trial: optuna.Trial) -> SkipMask:
        return self._mask([u for u in self.units if trial.suggest_int(u.param, 0, 1)])

    def _skip_params(self, mask: SkipMask) -> dict[str, int | str]:
        chosen = self._chosen(mask)
        if chosen is None:
            raise InvalidMaskError(
                f"mask {mask} does not fit space {self.name!r} ({self.kind}, protected layers "
                f"{sorted(self.protected)}): enqueue a mask that leaves protected layers whole"
                + ("" if self.sublayer else " and skips whole layers")
            )
        return {u.param: int(u in chosen) for u in self.units}


@dataclass(frozen=True)
class MixedSpace(SubsetSpace):
    """Each sub-layer's own choice (docs/theory.md, "Drafts at lower precision"): full, int8 or
    int4 (those of `precisions`), or skipped where it is free (protected layers are never skipped,
    but may run at lower precision). One Optuna categorical per sub-layer, `attn_<l>` and `mlp_<l>`
    (`full`, `int8`, `int4`, `skip`); the skip counts and r_draft bounds count skipped sub-layers,
    as a `sublayer` space's do.
    """

    sublayer: bool = True

    @property
    def kind(self) -> str:
        return "mixed"

    def _choices(self, layer: int) -> list[str]:
        names = [precision_name(bits) for bits in self.precisions]
        return names if layer in self.protected else [*names, SKIP]

    def count_of(self, mask: SkipMask) -> int | None:
        kept = [mask.attn_bits(i) for i in range(self.num_layers)] + [
            mask.mlp_bits(i) for i in range(self.num_layers)
        ]
        if any(bits and bits not in self.precisions for bits in kept):
            return None
        return self.skip_count(skips_of(mask))

    def _count(self, k: int) -> int:
        return self._count_with(k) * len(self.precisions) ** (self.units_total - k)

    def _random(self, k: int, rng: np.random.Generator) -> SkipMask:
        skips = self._random_with(k, rng)
        choices = np.asarray(self.precisions)
        attn = [0 if i in skips.attn else int(rng.choice(choices)) for i in range(self.num_layers)]
        mlp = [0 if i in skips.mlp else int(rng.choice(choices)) for i in range(self.num_layers)]
        return mask_from_bits(self.num_layers, attn, mlp)

    def _all_masks_with(self, k: int) -> Iterator[SkipMask]:
        for skips in self._all_with(k):
            kept = [
                (kind, i)
                for kind, skipped in (("attn", skips.attn), ("mlp", skips.mlp))
                for i in range(self.num_layers)
                if i not in skipped
            ]
            for chosen in itertools.product(self.precisions, repeat=len(kept)):
                bits = {"attn": [0] * self.num_layers, "mlp": [0] * self.num_layers}
                for (kind, i), b in zip(kept, chosen, strict=True):
                    bits[kind][i] = b
                yield mask_from_bits(self.num_layers, bits["attn"], bits["mlp"])

    def suggest(self, trial: optuna.Trial) -> SkipMask:
        chosen = {
            kind: [
                PRECISIONS.get(trial.suggest_categorical(f"{kind}_{i}", self._choices(i)), 0)
                for i in range(self.num_layers)
            ]
            for kind in ("attn", "mlp")
        }
        return mask_from_bits(self.num_layers, chosen["attn"], chosen["mlp"])

    def params_for(self, mask: SkipMask) -> dict[str, int | str]:
        if self.count_of(mask) is None:
            allowed = ", ".join(precision_name(b) for b in self.precisions)
            raise InvalidMaskError(
                f"mask {mask} does not fit space {self.name!r} (mixed, protected layers "
                f"{sorted(self.protected)}, precisions {allowed}): enqueue a mask that skips no "
                "protected layer and runs every other sub-layer at one of those precisions"
            )
        params: dict[str, int | str] = {}
        for i in range(self.num_layers):
            for kind, bits in (("attn", mask.attn_bits(i)), ("mlp", mask.mlp_bits(i))):
                params[f"{kind}_{i}"] = SKIP if bits == 0 else precision_name(bits)
        return params
