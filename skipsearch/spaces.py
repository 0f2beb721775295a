"""Search spaces: which skip masks a search may propose, and under which constraints (DESIGN §3).

A space file (YAML in `search_spaces/`, or any path) fixes the structure of the masks (`kind`) and
their constraints; `SpaceSpec.resolve(num_layers)` turns it into a `ConcreteSpace` for one model.
Layer indices and skip counts may be written as fractions of depth so that one file serves every
model: a fraction `f` of `n` items is `min(floor(f * n), n - 1)` for a layer index (0.5 -> L // 2,
1.0 -> the last layer) and `floor(f * n)` for a count. Write `1` for layer one and `1.0` for the last
layer; a negative integer counts from the end (-1 is the last layer).

Once protected layers are taken out, every constraint depends only on *how many* units a mask skips
(a unit is a layer, or a sub-layer for `kind: sublayer`): `r_draft` by sub-layer count is
`1 - skipped / units`. So the feasible set is the union over an interval of skip counts `k` of "k of
the free units", which makes counting, exact uniform sampling and enumeration cheap. The `r_draft`
bounds of a file are by sub-layer count, not by measured latency, so a file means the same on every
device; the cost model weighs the masks it finds.
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

from skipsearch.errors import ConfigError, InvalidMaskError
from skipsearch.masks import SkipMask

# The repository's search_spaces/, next to the package (this module lives in skipsearch/).
SPACES_DIR = Path(__file__).resolve().parent.parent / "search_spaces"
KINDS = ("contiguous", "sparse", "sublayer", "tiers")
ENUMERATE_LIMIT = 100_000
# Float slack when turning r_draft bounds into skip counts, so 1 - 6/12 <= 0.5 holds.
_EPS = 1e-9

LayerRef = int | float
"""A layer index (negative counts from the end) or a fraction of depth in [0, 1]."""


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

    def _layer(self, ref: LayerRef, num_layers: int) -> int:
        if isinstance(ref, float):
            return min(math.floor(ref * num_layers + _EPS), num_layers - 1)
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
        sublayer = self.kind == "sublayer"
        units = 2 * num_layers if sublayer else num_layers
        unit = "sub-layer" if sublayer else "layer"
        if self.kind == "contiguous":
            free = num_layers - 1 - max(protected, default=0)
        else:
            free = units - (2 if sublayer else 1) * len(protected)
        lows = [
            (_count(self.min_skipped, units), "min_skipped"),
            (math.ceil((1 - self.r_draft_max) * units - _EPS), "r_draft_max"),
        ]
        highs = [
            (math.floor((1 - self.r_draft_min) * units + _EPS), "r_draft_min"),
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
        cls = ContiguousSpace if self.kind == "contiguous" else SubsetSpace
        extra = {} if cls is ContiguousSpace else {"sublayer": sublayer}
        return cls(
            name=self.name,
            num_layers=num_layers,
            protected=protected,
            min_skipped=low,
            max_skipped=high,
            gamma_min=self.gamma_min,
            gamma_max=self.gamma_max,
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
    return math.floor(ref * units + _EPS) if isinstance(ref, float) else ref


@dataclass(frozen=True)
class TierPolicy:
    """Runtime tier choice: over the last `window` rounds, acceptance at or above
    `thresholds[i]` moves the draft to tier `i + 1` (tier 0 skips least)."""

    window: int
    thresholds: tuple[float, ...]


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


# -- loading and validation --------------------------------------------------------------------
_MASK_KEYS = (
    "name",
    "kind",
    "description",
    "protected",
    "r_draft_min",
    "r_draft_max",
    "min_skipped",
    "max_skipped",
    "gamma_min",
    "gamma_max",
)
_TIER_KEYS = ("name", "kind", "description", "base", "num_tiers", "policy")
_POLICY_KEYS = ("window", "thresholds")
# An early exit always skips the last layer, so contiguous spaces protect only the first.
_DEFAULT_PROTECTED: dict[str, tuple[LayerRef, ...]] = {
    "contiguous": (0,),
    "sparse": (0, -1),
    "sublayer": (0, -1),
}


class _Reader:
    """Typed access to one YAML mapping; every error names the file, the key and the fix."""

    def __init__(self, data: Any, source: str, allowed: Sequence[str] | None, prefix: str = "") -> None:
        """`allowed=None` reads a mapping without checking its keys yet (to learn its kind)."""
        self.source = source
        self.prefix = prefix
        if not isinstance(data, Mapping):
            raise self.error(
                "", f"expected a mapping of keys, got {type(data).__name__}", "see search_spaces/"
            )
        unknown = [] if allowed is None else sorted(str(k) for k in data if k not in allowed)
        if unknown:
            raise self.error(unknown[0], "is not a known key", f"remove it; {_allowed(allowed)}")
        self.data = data

    def error(self, key: str, problem: str, fix: str) -> ConfigError:
        return space_error(self.source, f"{self.prefix}{key}" if key else "", problem, fix)

    def _bad(self, key: str, want: str) -> ConfigError:
        return self.error(key, f"expected {want}, got {self.data[key]!r}", f"set {key} to {want}")

    def choice(self, key: str, options: Sequence[str]) -> str:
        if key not in self.data:
            raise self.error(key, "is missing", f"set it to one of {', '.join(options)}")
        if self.data[key] not in options:
            raise self._bad(key, f"one of {', '.join(options)}")
        return self.data[key]

    def text(self, key: str, default: str) -> str:
        value = self.data.get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def integer(self, key: str, default: int, low: int, high: int | None = None) -> int:
        value = self.data.get(key, default)
        if not _is_int(value) or value < low or (high is not None and value > high):
            raise self._bad(key, f"an integer >= {low}" if high is None else f"an integer in {low}..{high}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.data.get(key, default)
        if not (_is_int(value) or isinstance(value, float)) or not 0 <= value <= 1:
            raise self._bad(key, "a number in [0, 1]")
        return float(value)

    def depth_ref(self, key: str, value: Any) -> LayerRef:
        """An integer, or a float in [0, 1] read as a fraction of depth."""
        if _is_int(value) or (isinstance(value, float) and 0 <= value <= 1):
            return value
        raise self.error(
            key,
            f"expected an integer or a fraction of depth in [0, 1], got {value!r}",
            "write e.g. 3, -1 or 0.5",
        )

    def count(self, key: str, default: LayerRef | None) -> LayerRef | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        ref = self.depth_ref(key, value)
        if ref < 0:
            raise self._bad(key, "a count >= 0 or a fraction of depth in [0, 1]")
        return ref

    def mapping(self, key: str, allowed: Sequence[str]) -> _Reader:
        return _Reader(self.data.get(key, {}), self.source, allowed, prefix=f"{self.prefix}{key}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _allowed(keys: Sequence[str]) -> str:
    return f"allowed keys are {', '.join(keys)}"


def parse_space(data: Any, source: str, name: str, base_dir: Path = SPACES_DIR) -> SpaceSpec | TierSpec:
    """Validate one space mapping (`source` and `name` label it); a tiers `base` is looked up
    by name or as a path relative to `base_dir`."""
    kind = _Reader(data, source, None).choice("kind", KINDS)
    if kind == "tiers":
        return _parse_tiers(_Reader(data, source, _TIER_KEYS), name, base_dir)
    return _parse_mask_space(_Reader(data, source, _MASK_KEYS), kind, name)


def _parse_mask_space(reader: _Reader, kind: str, name: str) -> SpaceSpec:
    raw_protected = reader.data.get("protected", _DEFAULT_PROTECTED[kind])
    if raw_protected is None:
        raw_protected = []
    if not isinstance(raw_protected, list | tuple):
        raise reader.error(
            "protected", f"expected a list of layers, got {raw_protected!r}", "write e.g. [0, -1]"
        )
    protected = tuple(reader.depth_ref("protected", ref) for ref in raw_protected)
    if kind != "contiguous" and not protected:
        raise reader.error(
            "protected",
            f"a {kind} space must protect at least one layer, or a mask may skip them all",
            "protect e.g. [0, -1]",
        )
    spec = SpaceSpec(
        name=reader.text("name", name),
        kind=kind,
        source=reader.source,
        description=reader.text("description", ""),
        protected=protected,
        r_draft_min=reader.number("r_draft_min", 0.0),
        r_draft_max=reader.number("r_draft_max", 1.0),
        min_skipped=reader.count("min_skipped", 1),
        max_skipped=reader.count("max_skipped", None),
        gamma_min=reader.integer("gamma_min", 1, 1),
        gamma_max=reader.integer("gamma_max", 8, 1),
    )
    for low, high in (
        ("r_draft_min", "r_draft_max"),
        ("gamma_min", "gamma_max"),
        ("min_skipped", "max_skipped"),
    ):
        low_value, high_value = getattr(spec, low), getattr(spec, high)
        if high_value is not None and type(low_value) is type(high_value) and low_value > high_value:
            raise reader.error(
                low, f"{low}={low_value} is above {high}={high_value}", f"lower {low} or raise {high}"
            )
    return spec


def _parse_tiers(reader: _Reader, name: str, base_dir: Path) -> TierSpec:
    base_ref = reader.text("base", "sparse")
    relative = base_dir / base_ref
    try:
        base = load_space(relative if relative.is_file() else base_ref)
    except ConfigError as exc:
        raise reader.error(
            "base",
            f"cannot load base space {base_ref!r} ({exc})",
            "name a built-in space or a path next to this file",
        ) from None
    if isinstance(base, TierSpec):
        raise reader.error(
            "base", f"base space {base.source} is itself a tiers space", "use a mask space, e.g. sparse"
        )
    num_tiers = reader.integer("num_tiers", 3, 2, 4)
    policy = reader.mapping("policy", _POLICY_KEYS)
    thresholds = policy.data.get("thresholds")
    want = f"{num_tiers - 1} increasing acceptance levels in (0, 1), one per tier after the first"
    if (
        not isinstance(thresholds, list)
        or len(thresholds) != num_tiers - 1
        or not all(isinstance(t, float | int) and not isinstance(t, bool) and 0 < t < 1 for t in thresholds)
        or any(a >= b for a, b in itertools.pairwise(thresholds))
    ):
        raise policy.error(
            "thresholds", f"expected {want}, got {thresholds!r}", f"write e.g. {_example(num_tiers)}"
        )
    return TierSpec(
        name=reader.text("name", name),
        source=reader.source,
        description=reader.text("description", ""),
        base=base,
        num_tiers=num_tiers,
        policy=TierPolicy(
            window=policy.integer("window", 8, 1), thresholds=tuple(float(t) for t in thresholds)
        ),
    )


def _example(num_tiers: int) -> list[float]:
    return [round((i + 1) / num_tiers, 2) for i in range(num_tiers - 1)]


def available_spaces() -> list[str]:
    """Names of the built-in space files."""
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def space_path(ref: str | Path) -> Path:
    """A built-in name (`sparse`) or a path to a YAML file -> the file's path."""
    path = Path(ref)
    if path.is_file():
        return path
    if path.suffix or len(path.parts) > 1:
        raise ConfigError(f"search space file {path} does not exist: check the path")
    builtin = SPACES_DIR / f"{ref}.yaml"
    if not builtin.is_file():
        names = ", ".join(available_spaces())
        raise ConfigError(f"unknown search space {str(ref)!r}: use one of {names} or a path to a YAML file")
    return builtin


def load_space(ref: str | Path) -> SpaceSpec | TierSpec:
    """Load and validate a space file by built-in name or path."""
    path = space_path(ref)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"search space {path} is not valid YAML ({exc}): fix the syntax") from None
    return parse_space(data, source=str(path), name=path.stem, base_dir=path.parent)
