"""Search strategies: who proposes the next mask (docs/architecture.md, "Strategies").

A strategy is a class with two answers: a `plan` (fixed masks to evaluate first, in order) and a
`sampler` (the Optuna sampler that proposes once the plan is spent; None when the plan is the whole
strategy). The study loop enqueues plan masks and asks Optuna for the rest, so every strategy gets
the same storage, resume and trials table, and a new strategy is a new class in `STRATEGIES`.
"""

from __future__ import annotations

import importlib.util
import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import optuna

from skipsearch.acceptance.importance import SublayerImportance
from skipsearch.errors import ConfigError
from skipsearch.masks import BYTES_SHARE, FULL_BITS, SkipMask, SublayerWeights
from skipsearch.search.knapsack import Option, choice_frontier, knapsack_frontier
from skipsearch.search.space_precision import mask_from_bits, with_bits
from skipsearch.search.spaces import ENUMERATE_LIMIT, ConcreteSpace, spread
from skipsearch.search.subset_spaces import MixedSpace, SubsetSpace, Unit

QUANTIZATION_ERROR = {8: 2.0**-8, 4: 2.0**-4}
"""The importance proxy of running a sub-layer at `bits` as a share of skipping it, `2^-bits`: the
relative error of a `bits`-bit grid, where a skip loses the sub-layer's whole output. The measured
agreement of whole drafts is of that size or smaller (docs/theory.md, "Drafts at lower precision":
SmolLM2-135M's every layer at int8 disagrees at about 1% of positions, at int4 in groups of 32 under
1%, in groups of 64 about 10%, where skipping one layer costs a few percent)."""


@dataclass(frozen=True)
class PlanContext:
    """What a strategy may look at: the space, the run's seed and budget, the masks this study has
    already scored or has in flight (a live view), and cached scores of masks (None: not cached)."""

    space: ConcreteSpace
    seed: int
    budget: int
    seen: Container[str]
    cached_value: Callable[[SkipMask], float | None]


@dataclass(frozen=True)
class Strategy(ABC):
    name: ClassVar[str]

    @abstractmethod
    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        """Masks to evaluate first, in order (masks already seen are skipped by the loop).

        Called once before the study starts, so a strategy that cannot run raises here."""

    def sampler(self, seed: int, pareto: bool) -> optuna.samplers.BaseSampler | None:
        """Who proposes after the plan; None ends the search when the plan is spent."""
        return None

    def options(self) -> dict[str, Any]:
        """The settings a resumed study must share with the one it continues."""
        return {"strategy": self.name, **asdict(self)}


@dataclass(frozen=True)
class RandomStrategy(Strategy):
    """Uniform over the feasible space, without repeats (exact sampling, see `random_mask`)."""

    name: ClassVar[str] = "random"

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        rng = np.random.default_rng(ctx.seed)
        while (mask := ctx.space.random_unseen(rng, ctx.seen)) is not None:
            yield mask


@dataclass(frozen=True)
class UniformStrategy(Strategy):
    """Evenly spaced skips, one mask per skip count; counts spread evenly when the budget is short.

    It has at most one candidate per count, so it may stop below the budget.
    """

    name: ClassVar[str] = "uniform"

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        return iter(ctx.space.uniform_masks(ctx.budget))


@dataclass(frozen=True)
class ExhaustiveStrategy(Strategy):
    """Every feasible mask (a contiguous space: every exit layer); refuses a space it cannot finish."""

    name: ClassVar[str] = "exhaustive"
    limit: int = ENUMERATE_LIMIT

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        masks = ctx.space.enumerate(self.limit)
        if len(masks) > ctx.budget:
            raise ConfigError(
                f"exhaustive search of space {ctx.space.name!r} needs {len(masks)} evaluations but the "
                f"budget is {ctx.budget}: raise the budget to {len(masks)} or use the learned strategy"
            )
        return iter(masks)


# Sampler name -> packages it imports beyond optuna's own dependencies.
SAMPLER_PACKAGES: dict[str, tuple[str, ...]] = {
    "tpe": (),
    "gp": ("scipy", "torch"),
    "cmaes": ("cmaes",),
    "nsga2": (),
}


@dataclass(frozen=True)
class LearnedStrategy(Strategy):
    """An Optuna sampler learns where good masks are: multivariate TPE with constant liar by
    default (the liar keeps parallel workers apart), or GP, CMA-ES (with margin, for 0/1 params),
    NSGA-II.

    `warm_start` first evaluates the best uniform and contiguous candidates the evaluation cache
    knows (by score), else `warm_start_size` uniform candidates, so the sampler starts from the
    baselines instead of from scratch.
    """

    name: ClassVar[str] = "learned"
    algorithm: str = "tpe"
    warm_start: bool = False
    warm_start_size: int = 3
    n_startup_trials: int = 10

    def __post_init__(self) -> None:
        if self.algorithm not in SAMPLER_PACKAGES:
            raise ConfigError(f"unknown sampler {self.algorithm!r}: use one of {', '.join(SAMPLER_PACKAGES)}")
        missing = [p for p in SAMPLER_PACKAGES[self.algorithm] if importlib.util.find_spec(p) is None]
        if missing:
            raise ConfigError(
                f"sampler {self.algorithm!r} needs {', '.join(missing)} (not installed): "
                f"pip install {' '.join(missing)}, or use sampler tpe"
            )

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        """The space's precision anchors (every layer at one lower precision, nothing skipped),
        then the warm start: a sampler of skip params would hardly ever propose skipping nothing."""
        anchors = ctx.space.precision_anchors()
        return itertools.chain(anchors, self._warm_start(ctx))

    def _warm_start(self, ctx: PlanContext) -> Iterator[SkipMask]:
        if not self.warm_start:
            return iter(())
        space = ctx.space
        prefixes = (SkipMask.prefix(space.num_layers, e) for e in range(1, space.num_layers))
        candidates = {str(m): m for m in [*space.uniform_masks(), *prefixes] if space.is_feasible(m)}
        scored = [(value, m) for m in candidates.values() if (value := ctx.cached_value(m)) is not None]
        if not scored:
            return iter(space.uniform_masks(self.warm_start_size))
        scored.sort(key=lambda pair: -pair[0])
        return iter([m for _, m in scored[: self.warm_start_size]])

    def sampler(self, seed: int, pareto: bool) -> optuna.samplers.BaseSampler:
        samplers = optuna.samplers
        if self.algorithm == "gp":
            return samplers.GPSampler(seed=seed, n_startup_trials=self.n_startup_trials)
        if self.algorithm == "cmaes":
            if pareto:
                raise ConfigError(
                    "sampler 'cmaes' optimises one objective: use tpe or nsga2 for a Pareto search"
                )
            return samplers.CmaEsSampler(seed=seed, n_startup_trials=self.n_startup_trials, with_margin=True)
        if self.algorithm == "nsga2":
            return samplers.NSGAIISampler(seed=seed)
        return samplers.TPESampler(
            seed=seed, multivariate=True, constant_liar=True, n_startup_trials=self.n_startup_trials
        )


@dataclass(frozen=True)
class InformedStrategy(Strategy):
    """Shared by the strategies that order units by importance: the units of a sparse or sublayer
    space, their importance and their cost.

    A `measured` importance was computed before the search from the single-unit masks, whose
    evaluations the pipeline took from the study's budget (`measured_units_budget`). A unit run at
    int8 or int4 loses a share of its skip importance (`QUANTIZATION_ERROR`, a proxy: no
    quantized mask is measured) and saves what the LatencyProfile's `precisions` say it does there.
    """

    importance: SublayerImportance | None = None
    weights: SublayerWeights | None = None

    def options(self) -> dict[str, Any]:
        """The importance and cost tables are data from the run directory, not settings."""
        source = None if self.importance is None else self.importance.source
        return {"strategy": self.name, "importance": source, "weighted": self.weights is not None}

    def units(self, space: ConcreteSpace) -> tuple[Unit, ...]:
        space = informed_space(self.name, space)
        if self.importance is None:
            raise ConfigError(
                f"strategy {self.name!r} needs sub-layer importance: run it through `skipsearch run`, "
                "which computes it from the reference cache"
            )
        self.importance.check_fits(space.num_layers)
        return space.units

    def value(self, unit: Unit) -> float:
        assert self.importance is not None
        return self.importance.of(unit.layer, unit.attn, unit.mlp)

    def quantized_value(self, unit: Unit, bits: int) -> float:
        """Importance lost by running `unit` at `bits`: its sub-layers' skip importance times
        `QUANTIZATION_ERROR[bits]` (0 at full precision). A sub-layer the importance has no value
        for (a protected one, under a `measured` importance) takes its table's mean."""
        if bits == FULL_BITS:
            return 0.0
        assert self.importance is not None
        tables = [self.importance.attn] * unit.attn + [self.importance.mlp] * unit.mlp
        return QUANTIZATION_ERROR[bits] * sum(_or_mean(table, unit.layer) for table in tables)

    def cost(self, unit: Unit, bits: int = 0) -> float:
        """Draft time the unit saves run at `bits` instead of full precision (0: skipped), in
        LatencyProfile seconds at the scoring context (its `precisions` timings, else bytes), else in
        sub-layers (a lower precision saving `1 - BYTES_SHARE[bits]` of one)."""
        if self.weights is None:
            return (unit.attn + unit.mlp) * (1.0 - BYTES_SHARE[bits])
        if bits == 0:
            return self.weights.attn[unit.layer] * unit.attn + self.weights.mlp[unit.layer] * unit.mlp
        if bits == FULL_BITS:
            return 0.0
        layers = {unit.layer} if unit.attn else set(), {unit.layer} if unit.mlp else set()
        mask = SkipMask(len(self.weights.attn), **{f"attn_int{bits}": layers[0], f"mlp_int{bits}": layers[1]})
        return self.weights.total * (1.0 - self.weights.share(mask))

    def choices(self, space: ConcreteSpace, units: Sequence[Unit], bits: int) -> list[Choice]:
        """The knapsack frontier of skips when every kept sub-layer runs at `bits`: skipping a unit
        saves what it costs at `bits` and loses its skip importance less its quantized one."""
        every = _sublayers(space.num_layers)  # the draft that skips nothing, all at `bits`
        saved = sum(self.cost(u, bits) for u in every)
        lost = sum(self.quantized_value(u, bits) for u in every)
        values = [self.value(u) - self.quantized_value(u, bits) for u in units]
        weights = [self.cost(u) - self.cost(u, bits) for u in units]
        return [
            Choice(
                with_bits(_skip(space.num_layers, [units[i] for i in items]), bits),
                saved + sum(weights[i] for i in items),
                lost + sum(values[i] for i in items),
            )
            for items in knapsack_frontier(values, weights, space.skip_counts)
        ]

    def mixed_choices(self, space: MixedSpace) -> list[Choice]:
        """The multiple-choice knapsack frontier of a mixed space: each sub-layer at one of the
        space's lower precisions, skipped (a free one), or as it is (where full is a choice)."""
        free = set(space.units)
        lower = [b for b in space.precisions if b != FULL_BITS]
        groups, sublayers = [], _sublayers(space.num_layers)
        for unit in sublayers:
            saving = {b: self.cost(unit, b) for b in lower}
            options = [
                (b, Option(self.quantized_value(unit, b), saving[b], skips=False))
                for b in lower
                if saving[b] > 0 or FULL_BITS not in space.precisions  # one that saves nothing is no choice
            ]
            if unit in free:
                options.append((0, Option(self.value(unit), self.cost(unit))))
            groups.append(options)
        required = [FULL_BITS not in space.precisions] * len(groups)
        frontier = choice_frontier([[o for _, o in g] for g in groups], space.skip_counts, required=required)
        found = []
        for choice in frontier:
            taken = [None if i is None else groups[g][i] for g, i in enumerate(choice)]
            bits = [FULL_BITS if t is None else t[0] for t in taken]  # attn_0, mlp_0, attn_1, ...
            mask = mask_from_bits(space.num_layers, bits[0::2], bits[1::2])
            picked = [t[1] for t in taken if t is not None]
            found.append(Choice(mask, sum(o.weight for o in picked), sum(o.value for o in picked)))
        return found


@dataclass(frozen=True)
class Choice:
    """A candidate draft of an informed strategy: the draft cost it saves and the importance it loses."""

    mask: SkipMask
    saved: float
    lost: float


def _sublayers(num_layers: int) -> list[Unit]:
    """Every sub-layer as a unit, in execution order."""
    return [
        Unit(layer, kind == "attn", kind == "mlp") for layer in range(num_layers) for kind in ("attn", "mlp")
    ]


def _or_mean(table: Sequence[float | None], layer: int) -> float:
    known = [v for v in table if v is not None]
    value = table[layer]
    return value if value is not None else (sum(known) / len(known) if known else 0.0)


def pareto(choices: Sequence[Choice]) -> list[Choice]:
    """The choices no other beats (saves at least as much for less lost), least saved first."""
    front, least = [], float("inf")
    for choice in sorted(choices, key=lambda c: (-c.saved, c.lost)):
        if choice.lost < least:
            least = choice.lost
            front.append(choice)
    return front[::-1]


def informed_space(strategy: str, space: ConcreteSpace) -> SubsetSpace:
    """`space`, when an informed strategy can choose units in it (not a contiguous one)."""
    if not isinstance(space, SubsetSpace):
        raise ConfigError(
            f"strategy {strategy!r} chooses among the free layers of a sparse or sublayer space, but "
            f"space {space.name!r} is {space.kind}: use --strategy exhaustive for it"
        )
    return space


def measured_units_budget(space: SubsetSpace, importance: str | None) -> int:
    """Evaluations a `measured` importance takes from the budget: one per free unit of the space."""
    return len(space.units) if importance == "measured" else 0


def unit_masks(space: SubsetSpace) -> list[SkipMask]:
    """The single-unit masks of a space: what `--importance measured` evaluates."""
    return [_skip(space.num_layers, [unit]) for unit in space.units]


def _skip(num_layers: int, chosen: Sequence[Unit]) -> SkipMask:
    """The mask that skips exactly the `chosen` units."""
    return SkipMask(
        num_layers,
        frozenset(u.layer for u in chosen if u.attn),
        frozenset(u.layer for u in chosen if u.mlp),
    )


@dataclass(frozen=True)
class RankingStrategy(InformedStrategy):
    """Skip the `k` least important units, one mask per skip count the space allows (spread evenly
    when the budget is short): `uniform` with the layers chosen by importance instead of spacing.

    It has at most one candidate per count, so it may stop below the budget.
    """

    name: ClassVar[str] = "ranking"

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        """At each of the space's precisions, the `k` units that lose least by skipping rather than
        running at it; (precision, count) pairs spread evenly when the budget is short."""
        units, space = self.units(ctx.space), ctx.space
        pairs = spread([(bits, k) for bits in space.precisions for k in space.skip_counts], ctx.budget)
        ranked = {
            bits: sorted(units, key=lambda u, b=bits: self.value(u) - self.quantized_value(u, b))
            for bits in space.precisions
        }
        masks = [with_bits(_skip(space.num_layers, ranked[bits][:k]), bits) for bits, k in pairs]
        return iter([mask for mask in masks if not mask.is_empty])  # the full model is no draft


@dataclass(frozen=True)
class KnapsackStrategy(InformedStrategy):
    """KnapSpec-style DP: for every level of draft cost saved, the least important feasible set of
    units that saves it (`knapsack_frontier`); `candidates` of these (default: the budget), spread
    evenly over the savings, are measured and the best by the real score wins.

    Counted in sub-layers, the frontier has at most one set per skip count, so like `uniform` it
    may stop below the budget; measured times give many more levels.
    """

    name: ClassVar[str] = "knapsack"
    candidates: int | None = None

    def options(self) -> dict[str, Any]:
        return {**super().options(), "candidates": self.candidates}

    def planned(self, ctx: PlanContext) -> int:
        return ctx.budget if self.candidates is None else min(self.candidates, ctx.budget)

    def plan(self, ctx: PlanContext) -> Iterator[SkipMask]:
        """The frontier of draft cost saved against importance lost: over skips at each of the
        space's precisions (merged), or, in a mixed space, over each sub-layer's choice."""
        units, space = self.units(ctx.space), ctx.space
        if isinstance(space, MixedSpace):
            frontier = self.mixed_choices(space)
        elif len(space.precisions) == 1:
            frontier = self.choices(space, units, space.precisions[0])
        else:
            frontier = pareto([c for bits in space.precisions for c in self.choices(space, units, bits)])
        frontier = [choice for choice in frontier if not choice.mask.is_empty]  # the full model is no draft
        chosen = [frontier[i] for i in spread(range(len(frontier)), self.planned(ctx))]
        return iter([choice.mask for choice in chosen])


@dataclass(frozen=True)
class KnapsackTPEStrategy(KnapsackStrategy):
    """The knapsack candidates first (default: a third of the budget), then multivariate TPE
    warm-started with them: they are trials of the same study, so TPE models them from its first
    ask, the way `learned --warm-start` starts from the baselines."""

    name: ClassVar[str] = "knapsack+tpe"

    def planned(self, ctx: PlanContext) -> int:
        if self.candidates is None:
            return max(1, ctx.budget // 3)
        return super().planned(ctx)

    def sampler(self, seed: int, pareto: bool) -> optuna.samplers.BaseSampler:
        return LearnedStrategy().sampler(seed, pareto)


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls
    for cls in (
        LearnedStrategy,
        RandomStrategy,
        UniformStrategy,
        ExhaustiveStrategy,
        RankingStrategy,
        KnapsackStrategy,
        KnapsackTPEStrategy,
    )
}
INFORMED = tuple(name for name, cls in STRATEGIES.items() if issubclass(cls, InformedStrategy))


def make_strategy(name: str, **options: Any) -> Strategy:
    """A strategy by name (`random`, `uniform`, `learned`, `exhaustive`, `ranking`, `knapsack`,
    `knapsack+tpe`) with its options."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)}")
    try:
        return STRATEGIES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad option for strategy {name!r} ({exc}): check the option names") from None
