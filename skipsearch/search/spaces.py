"""Concrete search spaces: the set of masks one space file allows for one model
(docs/architecture.md, "Search spaces").

Once protected layers are taken out, every constraint depends only on *how many* units a mask skips
(units are layers, or sub-layers for `sublayer`), so a space is "the masks of its structure that
skip k free units, k in an allowed set": any k-subset (`sparse`, `sublayer`), the early exit that
skips the last k layers (`contiguous`), or a run of k consecutive layers (`block`). That makes
counting, exact uniform sampling and enumeration cheap.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import optuna

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import SkipMask

ENUMERATE_LIMIT = 100_000


# -- concrete spaces ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ConcreteSpace(ABC):
    """The feasible masks of one space for one depth: free units, skip-count range, gamma range.

    Subclasses only say how to build masks that skip exactly `k` units; counting, sampling,
    enumeration and feasibility over the whole space are shared here.
    """

    name: str
    num_layers: int
    protected: frozenset[int]
    min_skipped: int
    max_skipped: int
    gamma_min: int
    gamma_max: int

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
        """Units `mask` skips, or None when it is not of this space's structure or skips a
        protected layer (whatever its count)."""

    @abstractmethod
    def _count_with(self, k: int) -> int: ...

    @abstractmethod
    def _random_with(self, k: int, rng: np.random.Generator) -> SkipMask: ...

    @abstractmethod
    def _evenly_spaced_with(self, k: int) -> SkipMask: ...

    @abstractmethod
    def _all_with(self, k: int) -> Iterator[SkipMask]: ...

    @abstractmethod
    def suggest(self, trial: optuna.Trial) -> SkipMask:
        """Ask an Optuna trial for one mask of this structure (it may break the count limits)."""

    @abstractmethod
    def params_for(self, mask: SkipMask) -> dict[str, int]:
        """The trial params `suggest` reads as `mask`, for `study.enqueue_trial`."""

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
        k = self.skip_count(mask)
        if k is None:
            return 1.0
        return max(self.min_skipped - k, k - self.max_skipped, 0) / self.units_total

    def is_feasible(self, mask: SkipMask) -> bool:
        return self.violation(mask) == 0

    def size(self) -> int:
        """Exact number of feasible masks."""
        return sum(self._count_with(k) for k in self.skip_counts)

    def random_mask(self, rng: np.random.Generator) -> SkipMask:
        """A mask drawn uniformly from the feasible space, exactly, by counting.

        The skip count `k` is drawn with weight C(free, k), then `k` free units uniformly. Rejection
        sampling would waste almost every draw when the r_draft band is narrow.
        """
        counts = [self._count_with(k) for k in self.skip_counts]
        weights = np.array([c / max(counts) for c in counts])  # exact ints may overflow a float
        k = int(rng.choice(np.asarray(self.skip_counts), p=weights / weights.sum()))
        return self._random_with(k, rng)

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
        """Evenly spaced skips, one mask per skip count (so per r_draft level), fewest skips first.

        With `n` below the number of counts, `n` counts evenly spread over the range are kept.
        """
        return [self._evenly_spaced_with(k) for k in spread(self.skip_counts, n)]

    def enumerate(self, limit: int = ENUMERATE_LIMIT) -> list[SkipMask]:
        """Every feasible mask, fewest skips first; a ConfigError when there are over `limit`."""
        size = self.size()
        if size > limit:
            raise ConfigError(
                f"search space {self.name!r} has {size} feasible masks at {self.num_layers} layers, "
                f"more than the {limit} that can be enumerated: use the learned or random strategy, "
                "or tighten the space (max_skipped, r_draft_min/r_draft_max)"
            )
        return [mask for k in self.skip_counts for mask in self._all_with(k)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description: stored with a study so a resume can check it is the same."""
        return {
            "name": self.name,
            "kind": self.kind,
            "num_layers": self.num_layers,
            "protected": sorted(self.protected),
            "skipped": [self.min_skipped, self.max_skipped],
            "gamma": [self.gamma_min, self.gamma_max],
        }


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

    def suggest(self, trial: optuna.Trial) -> SkipMask:
        exit_layer = trial.suggest_int(
            "exit_layer", self.num_layers - self.max_skipped, self.num_layers - self.min_skipped
        )
        return SkipMask.prefix(self.num_layers, exit_layer)

    def params_for(self, mask: SkipMask) -> dict[str, int]:
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

    def suggest(self, trial: optuna.Trial) -> SkipMask:
        start = trial.suggest_int("block_start", 0, self.num_layers - self.min_skipped)
        return self._block(start, trial.suggest_int("block_length", self.min_skipped, self.max_skipped))

    def params_for(self, mask: SkipMask) -> dict[str, int]:
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

    def suggest(self, trial: optuna.Trial) -> SkipMask:
        return self._mask([u for u in self.units if trial.suggest_int(u.param, 0, 1)])

    def params_for(self, mask: SkipMask) -> dict[str, int]:
        chosen = self._chosen(mask)
        if chosen is None:
            raise InvalidMaskError(
                f"mask {mask} does not fit space {self.name!r} ({self.kind}, protected layers "
                f"{sorted(self.protected)}): enqueue a mask that leaves protected layers whole"
                + ("" if self.sublayer else " and skips whole layers")
            )
        return {u.param: int(u in chosen) for u in self.units}


def spread(values: Sequence[int], n: int | None) -> list[int]:
    """`n` items evenly spread over `values` (ends included); all of them when `n` is None or
    not smaller."""
    if n is None or n >= len(values):
        return list(values)
    if n <= 0:
        return []
    if n == 1:
        return [values[len(values) // 2]]
    return [values[int(i)] for i in np.rint(np.linspace(0, len(values) - 1, n))]
