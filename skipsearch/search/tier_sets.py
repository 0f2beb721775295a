"""Search for tier sets over the masks a run already evaluated: Optuna over simulations, no model.

The expensive part of a tier set — each tier's AcceptanceProfile — is in the run's evaluation
cache. A candidate pool (the best masks alone and the best contiguous exits) is scored once; then
a small TPE study per tier count K picks K masks from the pool, the policy's window and thresholds
and γ, each trial one `TierScorer` simulation (milliseconds). The result is reported next to the
best single mask, and the best set becomes `tiers.json`, the capture manifest.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.config import RunConfig
from skipsearch.cost.closed_forms import optimal_gamma
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.options import DEFAULT_GAMMA_MAX
from skipsearch.search.space_spec import TierSpace
from skipsearch.search.stored import load_run, run_profiles
from skipsearch.store import TIER_TABLE_FILE, TIERS_FILE, write_text_atomic
from skipsearch.tiers.manifest import TierManifest
from skipsearch.tiers.policy import TierPolicy
from skipsearch.tiers.simulation import (
    CostModel,
    Single,
    Tier,
    TierScore,
    TierScorer,
    closed_form,
    cost_model,
    order_tiers,
)

log = logging.getLogger(__name__)

SIZES = (2, 3, 4)
# Threshold range the study samples: 0 and 1 are not acceptance levels a policy can act on.
LEVELS = (0.02, 0.98)


@dataclass(frozen=True)
class Candidate:
    """A mask the pool offers, with its AcceptanceProfile and its speedup alone at its best γ."""

    mask: SkipMask
    profile: AcceptanceProfile
    speedup: float
    gamma: int

    @property
    def tier(self) -> Tier:
        return Tier(self.mask, self.profile)


@dataclass(frozen=True)
class TierSetResult:
    """One tier set (tier 0 richest), its best policy and its simulated score; `pool_best` is the
    best mask of the whole pool alone, the baseline a tier set has to beat to be worth its graphs."""

    tiers: tuple[Candidate, ...]
    policy: TierPolicy
    score: TierScore
    pool_best: Single

    @property
    def gain(self) -> float:
        """Relative gain over the pool's best single mask: 0.05 = 5% faster."""
        return self.score.speedup / self.pool_best.speedup - 1.0

    def manifest(self, model: str, provenance: Mapping[str, Any], cost_name: str) -> TierManifest:
        return TierManifest(
            model=model,
            masks=tuple(c.mask for c in self.tiers),
            policy=self.policy,
            gammas=self.score.gammas,
            predicted={
                "cost": cost_name,
                **self.score.to_dict(),
                "pool_best_single": vars(self.pool_best),
                "gain_over_pool_best_single": self.gain,
            },
            provenance=dict(provenance),
        )

    def row(self) -> dict[str, Any]:
        best = self.score.best_single
        return {
            "num_tiers": len(self.tiers),
            "speedup": self.score.speedup,
            "gammas": list(self.score.gammas),
            "gain_over_pool_best": self.gain,
            "pool_best_speedup": self.pool_best.speedup,
            "gain_over_own_best": self.score.gain,
            "own_best_speedup": best.speedup,
            "own_best_mask": best.mask,
            "window": self.policy.window,
            "thresholds": list(self.policy.thresholds),
            "tokens_per_round": self.score.simulation.tokens_per_round,
            "time_per_round": self.score.simulation.time_per_round,
            "tier_share": [round(s, 3) for s in self.score.simulation.tier_share],
            "masks": [str(c.mask) for c in self.tiers],
        }


# -- reading runs ----------------------------------------------------------------------------------
def load_profiles(run_dirs: Sequence[Path]) -> tuple[dict[str, AcceptanceProfile], RunConfig, dict]:
    """Every AcceptanceProfile the runs scored, with the first run's config and provenance.

    Runs may only be pooled when they measured the same model on the same prompt set.
    """
    if not run_dirs:
        raise ConfigError("no run directory given: pass the --out directory of `skipsearch run`")
    config, provenance = load_run(run_dirs[0])
    profiles: dict[str, AcceptanceProfile] = {}
    for run_dir in run_dirs:
        other, other_provenance = load_run(run_dir)
        if (other.measure.model, other_provenance.get("prompt_set")) != (
            config.measure.model,
            provenance.get("prompt_set"),
        ):
            raise ConfigError(
                f"{run_dir} measured {other.measure.model} on {other_provenance.get('prompt_set')}, not "
                f"{config.measure.model} on {provenance.get('prompt_set')}: pool runs of one model and "
                "prompt set"
            )
        profiles.update(run_profiles(run_dir))
    if not profiles:
        raise ConfigError(f"{', '.join(map(str, run_dirs))} scored no mask yet: run a search first")
    return profiles, config, provenance


def candidate_pool(
    profiles: Mapping[str, AcceptanceProfile],
    num_layers: int,
    cost: CostModel = closed_form,
    gamma_max: int = 8,
    top_n: int = 10,
) -> list[Candidate]:
    """The `top_n` best masks alone plus the `top_n` best contiguous exits, richest first.

    Contiguous exits are kept apart because they are the tiers every engine can run and because
    the best masks of a sparse search tend to be near-copies of each other.
    """
    scored = []
    for key, profile in profiles.items():
        mask = SkipMask.parse(key, num_layers)
        best = optimal_gamma(profile, cost(mask), gamma_max)
        scored.append(Candidate(mask, profile, best.speedup, best.gamma))
    scored.sort(key=lambda c: (-c.speedup, str(c.mask)))
    exits = [c for c in scored if c.mask.exit_layer is not None and c.mask.exit_layer < num_layers]
    pool = {str(c.mask): c for c in [*scored[:top_n], *exits[:top_n]]}
    if len(pool) < 2:
        raise ConfigError(
            f"only {len(pool)} evaluated mask(s) to build tiers from: a tier set needs at least 2; "
            "search with a larger budget first"
        )
    return [c for t in order_tiers([c.tier for c in pool.values()]) for c in [pool[str(t.mask)]]]


# -- the study -------------------------------------------------------------------------------------
class _Objective:
    """One TPE trial: K distinct pool indices, window, thresholds and a γ per tier -> speedup."""

    def __init__(self, pool: Sequence[Candidate], size: int, cost: CostModel, gamma_max: int) -> None:
        self.pool, self.size, self.cost, self.gamma_max = pool, size, cost, gamma_max
        top = max(pool, key=lambda c: c.speedup)
        self.pool_best = Single(str(top.mask), top.gamma, top.speedup)
        self.scorers: dict[tuple[int, ...], TierScorer] = {}
        self.results: dict[int, TierSetResult] = {}

    def __call__(self, trial: optuna.Trial) -> float:
        chosen = sorted(
            {trial.suggest_categorical(f"tier_{i}", range(len(self.pool))) for i in range(self.size)}
        )
        thresholds = sorted(trial.suggest_float(f"threshold_{i}", *LEVELS) for i in range(self.size - 1))
        if len(chosen) < self.size or len(set(thresholds)) < len(thresholds):
            raise optuna.TrialPruned("a repeated tier or threshold")
        policy = TierPolicy(trial.suggest_int("window", 1, 32, log=True), tuple(thresholds))
        key = tuple(chosen)  # the pool is ordered richest first, so sorted indices are tier order
        if key not in self.scorers:
            self.scorers[key] = TierScorer([self.pool[i].tier for i in key], self.cost, self.gamma_max)
        gammas = [trial.suggest_int(f"gamma_{t}", 1, self.gamma_max) for t in range(self.size)]
        score = self.scorers[key].score(policy, gammas)
        self.results[trial.number] = TierSetResult(
            tuple(self.pool[i] for i in key), policy, score, self.pool_best
        )
        return score.speedup


def _starts(pool: Sequence[Candidate], size: int, start: TierPolicy | None) -> list[dict[str, Any]]:
    """Trials each study asks first, each mask at its own best γ: the `size` best masks alone
    under `start` (a tiers YAML's policy, when it has `size` tiers), and the best mask as tier 0
    over the next cheaper ones under a policy that almost never leaves it — about the best single
    mask's speedup, so a study reports a set below it only if it found nothing better."""

    def trial(indices: Sequence[int], policy: TierPolicy) -> dict[str, Any]:
        return {
            **{f"tier_{t}": index for t, index in enumerate(indices)},
            **{f"gamma_{t}": pool[index].gamma for t, index in enumerate(indices)},
            **{f"threshold_{t}": level for t, level in enumerate(policy.thresholds)},
            "window": policy.window,
        }

    ranked = sorted(range(len(pool)), key=lambda i: -pool[i].speedup)
    starts = []
    if start is not None and len(start.thresholds) == size - 1:
        starts.append(trial(sorted(ranked[:size]), start))
    best = ranked[0]
    if best + size <= len(pool):  # the pool is richest first: cheaper masks come after
        levels = tuple(LEVELS[1] - 0.01 * (size - 2 - t) for t in range(size - 1))
        starts.append(trial(range(best, best + size), TierPolicy(32, levels)))
    return starts


def drop_unused(result: TierSetResult, cost: CostModel, gamma_max: int) -> TierSetResult:
    """The same set without tiers the simulation never drafted with (each is a graph to capture
    for nothing). Tier `i`'s rounds are those where the window's mean falls in
    `[thresholds[i-1], thresholds[i])`; when that never happened, dropping the tier and its lower
    threshold leaves every decision on the calibration trajectories as it was."""
    keep = [t for t, rounds in enumerate(result.score.simulation.tier_rounds) if rounds or t == 0]
    if len(keep) in (1, len(result.tiers)):  # nothing to drop, or one tier left: not a tier set
        return result
    tiers = tuple(result.tiers[t] for t in keep)
    policy = TierPolicy(result.policy.window, tuple(result.policy.thresholds[t - 1] for t in keep[1:]))
    gammas = [result.score.gammas[t] for t in keep]
    score = TierScorer([c.tier for c in tiers], cost, gamma_max).score(policy, gammas)
    return TierSetResult(tiers, policy, score, result.pool_best)


def search_tier_sets(
    pool: Sequence[Candidate],
    cost: CostModel = closed_form,
    gamma_max: int = 8,
    trials: int = 200,
    sizes: Iterable[int] = SIZES,
    seed: int = 0,
    start: TierPolicy | None = None,
) -> list[TierSetResult]:
    """The best tier set each size's study found (unused tiers dropped), best first; each study
    begins with `_starts`."""
    best: list[TierSetResult] = []
    for size in sizes:
        if size > len(pool):
            log.info("pool of %d masks is too small for %d tiers: skipped", len(pool), size)
            continue
        objective = _Objective(pool, size, cost, gamma_max)
        study = optuna.create_study(
            direction="maximize",
            sampler=optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=20),
        )
        for params in _starts(pool, size, start):
            study.enqueue_trial(params)
        study.optimize(objective, n_trials=trials)
        completed = [t for t in study.trials if t.number in objective.results]
        if completed:
            winner = max(completed, key=lambda t: (t.value, -t.number))
            best.append(drop_unused(objective.results[winner.number], cost, gamma_max))
    if not best:
        raise ConfigError(f"no tier set of sizes {list(sizes)} fits a pool of {len(pool)} masks")
    return sorted(best, key=lambda r: -r.score.speedup)


# -- a run's tiers ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TierSearch:
    """What `search_run_tiers` found: the pool, the best set per size, and the manifest."""

    pool: tuple[Candidate, ...]
    results: tuple[TierSetResult, ...]
    manifest: TierManifest

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([r.row() for r in self.results])

    def write(self, directory: Path) -> Path:
        """`tiers.json` (the best set, the capture manifest) and `tier_sets.csv` (best per size)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.manifest.save(directory / TIERS_FILE)
        write_text_atomic(directory / TIER_TABLE_FILE, self.table().to_csv(index=False))
        return directory / TIERS_FILE


def search_run_tiers(
    run_dirs: Sequence[Path],
    cost: CostModel = closed_form,
    cost_name: str = "closed-form",
    sizes: Iterable[int] = SIZES,
    start: TierPolicy | None = None,
    trials: int = 200,
    top_n: int = 10,
    seed: int = 0,
) -> TierSearch:
    """Tier sets from the evaluation caches of `run_dirs` (one model, one prompt set)."""
    profiles, config, provenance = load_profiles(run_dirs)
    num_layers = int(provenance["num_layers"])
    gamma_max = config.gamma_max or DEFAULT_GAMMA_MAX  # a run.yaml made by hand may leave it to the space
    pool = candidate_pool(profiles, num_layers, cost, gamma_max, top_n)
    results = search_tier_sets(pool, cost, gamma_max, trials, sizes, seed, start)
    manifest = results[0].manifest(
        config.measure.model,
        {
            "runs": [str(r) for r in run_dirs],
            "prompt_set": provenance.get("prompt_set"),
            "masks_evaluated": len(profiles),
            "pool": len(pool),
            "trials_per_size": trials,
            "seed": seed,
            "torch": provenance.get("torch"),
            "transformers": provenance.get("transformers"),
        },
        cost_name,
    )
    return TierSearch(tuple(pool), tuple(results), manifest)


def search_space_tiers(
    run_dir: Path,
    space: TierSpace,
    cost: str = "closed-form",
    latency: LatencyProfile | None = None,
    trials: int = 200,
    seed: int = 0,
) -> TierSearch:
    """The tier sets of a `tiers` space after its base space was searched in `run_dir`: K from the
    space, its policy as the starting point; writes `tiers.json` and `tier_sets.csv` there, where
    `skipsearch export` finds them."""
    sizes, start = (space.num_tiers,), space.policy
    search = search_run_tiers([run_dir], cost_model(cost, latency), cost, sizes, start, trials, seed=seed)
    search.write(run_dir)
    return search
