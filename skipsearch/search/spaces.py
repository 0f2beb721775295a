"""Concrete search spaces: the set of masks one space file allows for one model
(docs/architecture.md, "Search spaces").

Once protected layers are taken out, every constraint depends only on *how many* units a mask skips
(units are layers, or sub-layers for `sublayer`), so a space is "the masks of its structure that
skip k free units, k in an allowed set": any k-subset (`sparse`, `sublayer`), the early exit that
skips the last k layers (`contiguous`), or a run of k consecutive layers (`block`). That makes
counting, exact uniform sampling and enumeration cheap.

A space may also choose the precision the draft reads its weights at (docs/theory.md, "Drafts at
lower precision"). Every structure takes a `precisions` set: the draft runs every sub-layer it
keeps at one of them (full, int8, int4), chosen with one categorical `precision` param; a single
precision adds no param, and the default (full only) is every space as it was. The `mixed` space
(`MixedSpace`) chooses per sub-layer instead: full, int8, int4 or skipped, one categorical each.

Here: the shared base (`ConcreteSpace`) and the run-shaped structures (`contiguous`, `block`); the
subsets (`sparse`, `sublayer`, `mixed`) are in `subset_spaces`, the precisions in `space_precision`.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import optuna

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import FULL_BITS, SkipMask
from skipsearch.search.space_precision import (
    PRECISION_PARAM,
    PRECISIONS,
    precision_label,
    precision_name,
    skips_of,
    uniform_bits,
    with_bits,
)

ENUMERATE_LIMIT = 100_000
T = TypeVar("T")


# -- concrete spaces ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ConcreteSpace(ABC):
    """The feasible masks of one space for one depth: free units, skip-count range, gamma range.

    Subclasses only say how to build masks that skip exactly `k` units; counting, sampling,
    enumeration and feasibility over the whole space are shared here, as is the draft's one
    precision, chosen from `precisions` (bits; every kept sub-layer, protected ones included, reads
    its weights at it).
    """

    name: str
    num_layers: int
    protected: frozenset[int]
    min_skipped: int
    max_skipped: int
    gamma_min: int
    gamma_max: int
    precisions: tuple[int, ...] = (FULL_BITS,)

    # -- what a subclass provides ---------------------------------------------------------------
    @property
    @abstractmethod
    def kind(self) -> str: ...

    @property
    @abstractmethod
    def units_total(self) -> int:
        """Units of the whole model (protected ones included): the denominator of r_draft."""

    @abstractmethod
    def skip_count(self, mask: SkipMask) -> int | None:
        """Units the skip mask `mask` (no sub-layer quantized) skips, or None when it is not of this
        space's structure or skips a protected layer (whatever its count)."""

    @abstractmethod
    def _count_with(self, k: int) -> int: ...

    @abstractmethod
    def _random_with(self, k: int, rng: np.random.Generator) -> SkipMask: ...

    @abstractmethod
    def _evenly_spaced_with(self, k: int) -> SkipMask: ...

    @abstractmethod
    def _all_with(self, k: int) -> Iterator[SkipMask]: ...

    @abstractmethod
    def _suggest_skips(self, trial: optuna.Trial) -> SkipMask:
        """Ask an Optuna trial for one skip mask of this structure (it may break the count limits)."""

    @abstractmethod
    def _skip_params(self, mask: SkipMask) -> dict[str, int | str]:
        """The trial params `_suggest_skips` reads as the skip mask `mask`."""

    # -- the draft's precision -----------------------------------------------------------------
    def count_of(self, mask: SkipMask) -> int | None:
        """Units `mask` skips, or None when its structure or its precision is not this space's."""
        bits = uniform_bits(mask)
        return self.skip_count(skips_of(mask)) if bits in self.precisions else None

    def _count(self, k: int) -> int:
        return self._count_with(k) * len(self.precisions)

    def _random(self, k: int, rng: np.random.Generator) -> SkipMask:
        mask = self._random_with(k, rng)
        if len(self.precisions) == 1:  # no draw: a space without the choice samples as it did
            return with_bits(mask, self.precisions[0])
        return with_bits(mask, self.precisions[int(rng.integers(len(self.precisions)))])

    def suggest(self, trial: optuna.Trial) -> SkipMask:
        """Ask an Optuna trial for one mask of this space (it may break the count limits): its
        skips, then its precision (one categorical `precision`, where there is a choice)."""
        mask = self._suggest_skips(trial)
        if len(self.precisions) == 1:
            return with_bits(mask, self.precisions[0])
        names = [precision_name(bits) for bits in self.precisions]
        return with_bits(mask, PRECISIONS[trial.suggest_categorical(PRECISION_PARAM, names)])

    def params_for(self, mask: SkipMask) -> dict[str, int | str]:
        """The trial params `suggest` reads as `mask`, for `study.enqueue_trial`."""
        bits = uniform_bits(mask)
        if bits not in self.precisions:
            allowed = ", ".join(precision_name(b) for b in self.precisions)
            raise InvalidMaskError(
                f"mask {mask} runs its sub-layers at {precision_label(mask)} but space {self.name!r} "
                f"allows one precision of {allowed} for all of them: enqueue a mask at one of those"
            )
        params = self._skip_params(skips_of(mask))
        if len(self.precisions) > 1:
            params[PRECISION_PARAM] = precision_name(bits)
        return params

    def precision_anchors(self) -> list[SkipMask]:
        """The feasible drafts that skip nothing and run every sub-layer at one of the space's
        lower precisions: a sampler of skip params would hardly ever propose them."""
        anchors = [
            with_bits(SkipMask(self.num_layers), bits) for bits in self.precisions if bits != FULL_BITS
        ]
        return [mask for mask in anchors if self.is_feasible(mask)]

    # -- shared --------------------------------------------------------------------------------
    @property
    def skip_counts(self) -> range:
        return range(self.min_skipped, self.max_skipped + 1)

    @property
    def gammas(self) -> range:
        return range(self.gamma_min, self.gamma_max + 1)

    @property
    def r_draft_range(self) -> tuple[float, float]:
        """The r_draft (by sub-layer count) the feasible masks span."""
        return 1 - self.max_skipped / self.units_total, 1 - self.min_skipped / self.units_total

    def violation(self, mask: SkipMask) -> float:
        """0 for a feasible mask; else how far it is outside (share of units; 1 if structural).

        Reported to Optuna as a constraint value, so samplers rank near misses above far ones.
        """
        if mask.num_layers != self.num_layers:
            raise InvalidMaskError(
                f"mask {mask} is for {mask.num_layers} layers but space {self.name!r} was resolved "
                f"for {self.num_layers}: resolve the space for the model the mask belongs to"
            )
        k = self.count_of(mask)
        if k is None:
            return 1.0
        return max(self.min_skipped - k, k - self.max_skipped, 0) / self.units_total

    def is_feasible(self, mask: SkipMask) -> bool:
        return self.violation(mask) == 0

    def size(self) -> int:
        """Exact number of feasible masks."""
        return sum(self._count(k) for k in self.skip_counts)

    def random_mask(self, rng: np.random.Generator) -> SkipMask:
        """A mask drawn uniformly from the feasible space, exactly, by counting.

        The skip count `k` is drawn with weight C(free, k), then `k` free units uniformly. Rejection
        sampling would waste almost every draw when the r_draft band is narrow.
        """
        counts = [self._count(k) for k in self.skip_counts]
        weights = np.array([c / max(counts) for c in counts])  # exact ints may overflow a float
        k = int(rng.choice(np.asarray(self.skip_counts), p=weights / weights.sum()))
        return self._random(k, rng)

    def random_unseen(
        self, rng: np.random.Generator, seen: Container[str], attempts: int = 64
    ) -> SkipMask | None:
        """A uniform feasible mask whose string is not in `seen`; None once every mask is seen.

        Rejection against `seen` keeps the draw uniform over the unseen masks; when it keeps
        failing the space is nearly spent, so a small one is enumerated instead.
        """
        for _ in range(attempts):
            mask = self.random_mask(rng)
            if str(mask) not in seen:
                return mask
        if self.size() > ENUMERATE_LIMIT:
            return None
        unseen = [m for m in self.enumerate() if str(m) not in seen]
        return unseen[int(rng.integers(len(unseen)))] if unseen else None

    def uniform_masks(self, n: int | None = None) -> list[SkipMask]:
        """Evenly spaced skips, one mask per skip count (so per r_draft level) and precision, fewest
        skips first within each precision.

        With `n` below the number of (precision, count) pairs, `n` pairs evenly spread over them
        are kept: every precision's share of the counts, spread over its range.
        """
        pairs = [(bits, k) for bits in self.precisions for k in self.skip_counts]
        return [with_bits(self._evenly_spaced_with(k), bits) for bits, k in spread(pairs, n)]

    def enumerate(self, limit: int = ENUMERATE_LIMIT) -> list[SkipMask]:
        """Every feasible mask, fewest skips first; a ConfigError when there are over `limit`."""
        size = self.size()
        if size > limit:
            raise ConfigError(
                f"search space {self.name!r} has {size} feasible masks at {self.num_layers} layers, "
                f"more than the {limit} that can be enumerated: use the learned or random strategy, "
                "or tighten the space (max_skipped, r_draft_min/r_draft_max)"
            )
        return [mask for k in self.skip_counts for mask in self._all_masks_with(k)]

    def _all_masks_with(self, k: int) -> Iterator[SkipMask]:
        return (with_bits(mask, bits) for mask in self._all_with(k) for bits in self.precisions)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description: stored with a study so a resume can check it is the same (a
        space of full precision only says nothing of precision, as before it could choose one)."""
        described = {
            "name": self.name,
            "kind": self.kind,
            "num_layers": self.num_layers,
            "protected": sorted(self.protected),
            "skipped": [self.min_skipped, self.max_skipped],
            "gamma": [self.gamma_min, self.gamma_max],
        }
        if self.precisions != (FULL_BITS,):
            described["precision"] = [precision_name(bits) for bits in self.precisions]
        return described


@dataclass(frozen=True)
class ContiguousSpace(ConcreteSpace):
    """Early exit: the draft runs layers `[0, E)`; searched through the one param `exit_layer`."""

    @property
    def kind(self) -> str:
        return "contiguous"

    @property
    def units_total(self) -> int:
        return self.num_layers

    def skip_count(self, mask: SkipMask) -> int | None:
        exit_layer = mask.exit_layer
        if exit_layer is None or any(p >= exit_layer for p in self.protected):
            return None
        return self.num_layers - exit_layer

    def _prefix(self, k: int) -> SkipMask:
        return SkipMask.prefix(self.num_layers, self.num_layers - k)

    def _count_with(self, k: int) -> int:
        return 1

    def _random_with(self, k: int, rng: np.random.Generator) -> SkipMask:
        return self._prefix(k)

    def _evenly_spaced_with(self, k: int) -> SkipMask:
        return self._prefix(k)

    def _all_with(self, k: int) -> Iterator[SkipMask]:
        yield self._prefix(k)

    def _suggest_skips(self, trial: optuna.Trial) -> SkipMask:
        exit_layer = trial.suggest_int(
            "exit_layer", self.num_layers - self.max_skipped, self.num_layers - self.min_skipped
        )
        return SkipMask.prefix(self.num_layers, exit_layer)

    def _skip_params(self, mask: SkipMask) -> dict[str, int | str]:
        k = self.skip_count(mask)
        if k is None:
            raise InvalidMaskError(
                f"mask {mask} is not an early exit above the protected layers of space {self.name!r}: "
                "enqueue a prefix mask (SkipMask.prefix) or use a sparse space"
            )
        return {"exit_layer": self.num_layers - k}


@dataclass(frozen=True)
class BlockSpace(ConcreteSpace):
    """One run of consecutive whole layers, anywhere above and below the protected ones.

    Middle layers are the ones a model tolerates losing together (the skips that searches of
    sparse spaces keep finding cluster there), and a run is only `L²/2` candidates, so a learned
    search of two params (`block_start`, `block_length`) or an exhaustive one covers it where a
    sparse search of the same budget samples a sliver of `2^L` subsets.
    """

    @property
    def kind(self) -> str:
        return "block"

    @property
    def units_total(self) -> int:
        return self.num_layers

    def skip_count(self, mask: SkipMask) -> int | None:
        layers = sorted(mask.attn)
        if not mask.is_layer_level or (layers and layers[-1] - layers[0] + 1 != len(layers)):
            return None
        return None if self.protected & mask.attn else len(layers)

    def _starts(self, k: int) -> list[int]:
        """First layers of the feasible runs of `k` layers."""
        return [s for s in range(self.num_layers - k + 1) if not self.protected & set(range(s, s + k))]

    def _block(self, start: int, k: int) -> SkipMask:
        return SkipMask.from_layers(self.num_layers, range(start, min(start + k, self.num_layers)))

    def _count_with(self, k: int) -> int:
        return len(self._starts(k))

    def _random_with(self, k: int, rng: np.random.Generator) -> SkipMask:
        starts = self._starts(k)
        return self._block(starts[int(rng.integers(len(starts)))], k)

    def _evenly_spaced_with(self, k: int) -> SkipMask:
        """The run in the middle of the feasible ones."""
        starts = self._starts(k)
        return self._block(starts[len(starts) // 2], k)

    def _all_with(self, k: int) -> Iterator[SkipMask]:
        return (self._block(start, k) for start in self._starts(k))

    def _suggest_skips(self, trial: optuna.Trial) -> SkipMask:
        start = trial.suggest_int("block_start", 0, self.num_layers - self.min_skipped)
        return self._block(start, trial.suggest_int("block_length", self.min_skipped, self.max_skipped))

    def _skip_params(self, mask: SkipMask) -> dict[str, int | str]:
        k = self.skip_count(mask)
        if not k:
            raise InvalidMaskError(
                f"mask {mask} is not one run of whole layers clear of the protected layers of space "
                f"{self.name!r}: enqueue e.g. SkipMask.from_layers(L, range(a, b)), or use a sparse space"
            )
        return {"block_start": min(mask.attn), "block_length": k}

    @staticmethod
    def longest_run(num_layers: int, protected: frozenset[int]) -> int:
        """The most layers one run can skip between the protected ones."""
        edges = [-1, *sorted(protected), num_layers]
        return max(b - a - 1 for a, b in itertools.pairwise(edges))


def spread(values: Sequence[T], n: int | None) -> list[T]:
    """`n` items evenly spread over `values` (ends included); all of them when `n` is None or
    not smaller."""
    if n is None or n >= len(values):
        return list(values)
    if n <= 0:
        return []
    if n == 1:
        return [values[len(values) // 2]]
    return [values[int(i)] for i in np.rint(np.linspace(0, len(values) - 1, n))]
