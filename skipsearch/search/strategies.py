"""Search strategies: who proposes the next mask (DESIGN §3).

A strategy is a class with two answers: a `plan` (fixed masks to evaluate first, in order) and a
`sampler` (the Optuna sampler that proposes once the plan is spent; None when the plan is the whole
strategy). The study loop enqueues plan masks and asks Optuna for the rest, so every strategy gets
the same storage, resume and trials table, and a new strategy is a new class in `STRATEGIES`.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from collections.abc import Callable, Container, Iterator
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import numpy as np
import optuna

from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.search.spaces import ENUMERATE_LIMIT, ConcreteSpace


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


STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (RandomStrategy, UniformStrategy, LearnedStrategy, ExhaustiveStrategy)
}


def make_strategy(name: str, **options: Any) -> Strategy:
    """A strategy by name (`random`, `uniform`, `learned`, `exhaustive`) with its options."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}: use one of {', '.join(STRATEGIES)}")
    try:
        return STRATEGIES[name](**options)
    except TypeError as exc:
        raise ConfigError(f"bad option for strategy {name!r} ({exc}): check the option names") from None
