"""Tier sets scored by simulating their policy over the calibration trajectories (docs/theory.md,
"Tier sets and CUDA graphs").

A single mask has to be right for the whole sequence; code and prose alternate between easy
stretches, where a cheap draft is accepted anyway, and hard ones, where only a rich draft is.
A tier set keeps K masks (tier 0 skips least, tier K-1 most), each with its own draft length γ,
and moves between them on the acceptance of the last `window` rounds.

Everything here is pure arithmetic. Every tier's AcceptanceProfile holds, per prompt and per
continuation position, whether that tier's draft matches the target (teacher-forced, so the
trajectory is the target's own greedy continuation whatever tier drafts). A round at position `k`
with tier `t` accepts the leading run of `t`'s matches from `k`, up to `γ_t`, and commits one more
token — exactly the engine's greedy round. Scoring a tier set needs each tier's mask measured once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from skipsearch.acceptance.profile import AcceptanceProfile, match_runs, play_rounds
from skipsearch.cost.calibrated import Calibrated
from skipsearch.cost.closed_forms import CostForm, SelfSpeculative, optimal_gamma
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.tiers.policy import TierController, TierPolicy, check_policy

CostModel = Callable[[SkipMask], CostForm]
"""Prices a tier's round: the closed form by default, the calibrated form with a LatencyProfile."""


def closed_form(mask: SkipMask) -> CostForm:
    """`γ r_draft + 1 - r_reuse` in autoregressive steps (docs/theory.md, "Speedup")."""
    return SelfSpeculative.from_mask(mask)


def calibrated(latency: LatencyProfile, context: float = 512) -> CostModel:
    """Round time from a device-measured LatencyProfile, in autoregressive steps (docs/theory.md,
    "Calibrated cost")."""
    return lambda mask: Calibrated(latency, mask, context)


def cost_model(name: str, latency: LatencyProfile | None = None, context: float = 512) -> CostModel:
    """The cost form a run's `cost` setting names (`closed-form` or `calibrated`)."""
    if name == "closed-form":
        return closed_form
    if name != "calibrated":
        raise ConfigError(f"unknown cost model {name!r}: use closed-form or calibrated")
    if latency is None:
        raise ConfigError("calibrated tier costs need a latency profile: run `skipsearch profile --model M`")
    return calibrated(latency, context)


# -- simulation ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trajectories:
    """Every tier's match runs on the same calibration prompts: `runs[tier][prompt][position]`."""

    runs: tuple[tuple[np.ndarray, ...], ...]

    @classmethod
    def of(cls, profiles: Sequence[AcceptanceProfile]) -> Trajectories:
        lengths = {tuple(len(row) for row in p.greedy_match) for p in profiles}
        if len(lengths) != 1:
            raise ConfigError(
                "the tiers' acceptance profiles cover different prompts or continuation lengths: "
                "take every tier from one run's evaluation cache (one model, one prompt set)"
            )
        return cls(tuple(tuple(match_runs(row) for row in p.greedy_match) for p in profiles))

    @property
    def num_tiers(self) -> int:
        return len(self.runs)


@dataclass(frozen=True)
class Simulation:
    """Rounds the policy ran over all calibration prompts; time is in autoregressive steps."""

    gammas: tuple[int, ...]
    rounds: int
    tokens: int
    time: float
    tier_rounds: tuple[int, ...]

    @property
    def tokens_per_round(self) -> float:
        return self.tokens / self.rounds if self.rounds else 1.0

    @property
    def time_per_round(self) -> float:
        return self.time / self.rounds if self.rounds else 1.0

    @property
    def speedup(self) -> float:
        """Committed tokens over the time plain decoding needs for them (one step each)."""
        return self.tokens / self.time if self.time else 1.0

    @property
    def tier_share(self) -> tuple[float, ...]:
        return tuple(r / self.rounds if self.rounds else 0.0 for r in self.tier_rounds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "gammas": list(self.gammas),
            "rounds": self.rounds,
            "tokens": self.tokens,
            "time": self.time,
            "tokens_per_round": self.tokens_per_round,
            "time_per_round": self.time_per_round,
            "speedup": self.speedup,
            "tier_share": list(self.tier_share),
        }


def simulate(
    trajectories: Trajectories, round_costs: Sequence[float], policy: TierPolicy, gammas: Sequence[int]
) -> Simulation:
    """Run the policy over every calibration prompt, each from tier 0 with an empty window.

    `round_costs[t]`: one round of tier `t` at its draft length `gammas[t]`, in autoregressive
    steps. A round whose
    window runs past the continuation while every observed draft matched is censored (its length
    is unknown) and ends that prompt (`acceptance.profile.play_rounds`); with one tier (or K copies of one
    mask) the result is that mask's `tokens_per_round(γ)` and speedup exactly.
    """
    if min(gammas) < 1:
        raise ConfigError(f"draft lengths must be >= 1, got {list(gammas)}")
    if not len(round_costs) == len(gammas) == trajectories.num_tiers:
        raise ConfigError(
            f"{len(round_costs)} round costs and {len(gammas)} draft lengths for "
            f"{trajectories.num_tiers} tiers"
        )
    rounds = tokens = 0
    time = 0.0
    usage = [0] * trajectories.num_tiers
    for prompt in range(len(trajectories.runs[0])):
        controller, runs = TierController(policy), [tier[prompt] for tier in trajectories.runs]

        def round_at(k: int, controller: TierController = controller, runs: list = runs) -> tuple[int, int]:
            return gammas[controller.tier], int(runs[controller.tier][k])

        for _, gamma, accepted, censored in play_rounds(len(runs[0]), round_at):
            if censored:
                break
            tier = controller.tier
            rounds += 1
            tokens += accepted + 1
            time += round_costs[tier]
            usage[tier] += 1
            controller.update(accepted, gamma)
    return Simulation(tuple(gammas), rounds, tokens, time, tuple(usage))


# -- scoring a tier set ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Tier:
    """One tier: a mask and its measured acceptance on the calibration prompts."""

    mask: SkipMask
    profile: AcceptanceProfile


def order_tiers(tiers: Sequence[Tier]) -> list[Tier]:
    """Richest draft (largest r_draft) first: tier 0 is the one the policy starts from."""
    return sorted(tiers, key=lambda t: (-t.mask.r_draft(), str(t.mask)))


@dataclass(frozen=True)
class Single:
    """One mask alone at its best γ: the baseline a tier set has to beat."""

    mask: str
    gamma: int
    speedup: float


@dataclass(frozen=True)
class TierScore:
    """A tier set's simulated result, next to the best of its masks alone at its best γ."""

    simulation: Simulation
    singles: tuple[Single, ...]

    @property
    def speedup(self) -> float:
        return self.simulation.speedup

    @property
    def gammas(self) -> tuple[int, ...]:
        return self.simulation.gammas

    @property
    def best_single(self) -> Single:
        return max(self.singles, key=lambda s: s.speedup)

    @property
    def gain(self) -> float:
        """Relative gain over the best single mask: 0.05 = 5% faster."""
        return self.speedup / self.best_single.speedup - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.simulation.to_dict(),
            "best_single": vars(self.best_single),
            "gain_over_best_single": self.gain,
        }


class TierScorer:
    """Scores many policies over one ordered tier set: runs and round costs are computed once."""

    def __init__(self, tiers: Sequence[Tier], cost: CostModel = closed_form, gamma_max: int = 8) -> None:
        if gamma_max < 1:
            raise ConfigError(f"gamma_max must be >= 1, got {gamma_max}")
        self.tiers = tuple(tiers)
        self.gamma_max = gamma_max
        self.trajectories = Trajectories.of([t.profile for t in self.tiers])
        forms = [cost(t.mask) for t in self.tiers]
        self.costs = {g: [f.round_cost(g) for f in forms] for g in range(1, gamma_max + 1)}
        self.singles = tuple(
            Single(str(t.mask), best.gamma, best.speedup)
            for t, form in zip(self.tiers, forms, strict=True)
            for best in [optimal_gamma(t.profile, form, gamma_max)]
        )

    def score(self, policy: TierPolicy, gammas: Sequence[int] | None = None) -> TierScore:
        """The set under `policy` with draft lengths `gammas` (default: each mask's best alone)."""
        check_policy(policy, len(self.tiers))
        gammas = tuple(gammas) if gammas is not None else tuple(s.gamma for s in self.singles)
        if len(gammas) != len(self.tiers) or not all(1 <= g <= self.gamma_max for g in gammas):
            raise ConfigError(f"need one draft length in 1..{self.gamma_max} per tier, got {list(gammas)}")
        costs = [self.costs[g][t] for t, g in enumerate(gammas)]
        return TierScore(simulate(self.trajectories, costs, policy, gammas), self.singles)
