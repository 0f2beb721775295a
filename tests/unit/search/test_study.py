"""Search strategies and the study loop, on a synthetic evaluator (no model: fast, exact).

The synthetic landscape: each sub-layer has a fixed "damage"; a mask's per-position acceptance is
`exp(-total damage of what it skips)` and position j matches when a fixed uniform draw is below it,
so skipping more never gains a match. Damages are irregular, so evenly spaced skips are not best.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import optuna
import pytest
from optuna.trial import TrialState

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, LocalExecutor, Outcome
from skipsearch.masks import SkipMask
from skipsearch.search import (
    LearnedStrategy,
    PlanContext,
    SearchConfig,
    Strategy,
    best_trial,
    load_study,
    make_strategy,
    run_study,
    study_trials_frame,
)
from skipsearch.search.space_files import load_space
from tests.unit.search.conftest import (
    NUM_LAYERS,
    CountingEvaluator,
    search,
    synthetic_profile,
    synthetic_score,
)


def masks_in_order(run_dir: Path, name: str) -> list[str]:
    return list(study_trials_frame(load_study(run_dir, name))["mask"])


# -- cache, repeats, guard ---------------------------------------------------------------------
class StuckSampler(optuna.samplers.BaseSampler):
    """Proposes the highest value of every param, always: one mask, over and over."""

    def infer_relative_search_space(self, study: optuna.Study, trial: Any) -> dict:
        return {}

    def sample_relative(self, study: optuna.Study, trial: Any, search_space: dict) -> dict:
        return {}

    def sample_independent(self, study: optuna.Study, trial: Any, name: str, distribution: Any) -> Any:
        return distribution.high


@dataclass(frozen=True)
class StuckStrategy(Strategy):
    """A new strategy is a new class: this one never plans and its sampler repeats itself."""

    name: ClassVar[str] = "stuck"

    def plan(self, ctx: PlanContext) -> Any:
        return iter(())

    def sampler(self, seed: int, pareto: bool) -> optuna.samplers.BaseSampler:
        return StuckSampler()


class ParallelExecutor(Executor):
    """Stands in for N Ray actors: `capacity` masks in flight, finishing newest first."""

    def __init__(self, evaluate: CountingEvaluator, capacity: int) -> None:
        self.evaluate, self._capacity, self.pending = evaluate, capacity, []
        self.max_in_flight = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def submit(self, mask: SkipMask) -> None:
        assert len(self.pending) < self._capacity
        self.pending.append(mask)
        self.max_in_flight = max(self.max_in_flight, len(self.pending))

    def wait_any(self) -> Outcome:
        mask = self.pending.pop()
        return Outcome(mask, self.evaluate(mask), 0.0)

    def close(self) -> None:
        self.pending.clear()


REPOSITORY = Path(__file__).resolve().parents[3]
CRASH_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.unit.search.conftest import CountingEvaluator, search
search(Path({run!r}), "learned", CountingEvaluator(log=Path({log!r}), hang_at=4), budget=8)
"""


# -- budget and exhaustive search --------------------------------------------------------------
@pytest.mark.parametrize("budget", [0, -5])
def test_budget_must_be_positive(budget: int) -> None:
    with pytest.raises(ConfigError, match="budget must be a positive"):
        SearchConfig(budget=budget)


def test_contiguous_exhaustive_finds_the_brute_force_best_exit(tmp_path: Path) -> None:
    space = load_space("contiguous").resolve(NUM_LAYERS)
    evaluate = CountingEvaluator()
    result = search(tmp_path, "exhaustive", evaluate, space=space, budget=100)
    brute = max(
        range(1, NUM_LAYERS),
        key=lambda e: (
            synthetic_score(
                SkipMask.prefix(NUM_LAYERS, e), synthetic_profile(SkipMask.prefix(NUM_LAYERS, e))
            ).value
        ),
    )
    assert result.best is not None and result.best.skip_mask.exit_layer == brute
    assert result.budget_used == len(evaluate.calls) == NUM_LAYERS - 1 and result.exhausted


def test_exhaustive_refuses_a_space_beyond_its_budget_or_limit(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="raise the budget to 837"):
        search(tmp_path / "a", "exhaustive", CountingEvaluator(), budget=50)
    with pytest.raises(ConfigError, match="can be enumerated"):
        search(tmp_path / "b", make_strategy("exhaustive", limit=100), CountingEvaluator(), budget=5000)


# -- strategies --------------------------------------------------------------------------------
def test_random_strategy_scores_distinct_feasible_masks(tmp_path: Path) -> None:
    evaluate = CountingEvaluator()
    result = search(tmp_path, "random", evaluate, budget=25)
    space = load_space("sparse").resolve(NUM_LAYERS)
    assert result.budget_used == 25 and len(set(evaluate.calls)) == 25
    assert all(space.is_feasible(SkipMask.parse(m, NUM_LAYERS)) for m in evaluate.calls)


def test_uniform_strategy_has_one_candidate_per_skip_count(tmp_path: Path) -> None:
    space = load_space("sparse").resolve(NUM_LAYERS)
    evaluate = CountingEvaluator()
    result = search(tmp_path / "all", "uniform", evaluate, budget=50)
    assert evaluate.calls == [str(m) for m in space.uniform_masks()]
    assert result.exhausted and result.budget_used == len(space.skip_counts)
    short = CountingEvaluator()
    search(tmp_path / "short", "uniform", short, budget=3)
    assert short.calls == [str(m) for m in space.uniform_masks(3)]


@pytest.mark.parametrize("seed", [0, 1])
def test_learned_beats_uniform_at_equal_budget(tmp_path: Path, seed: int) -> None:
    learned = search(tmp_path / "learned", "learned", CountingEvaluator(), budget=30, seed=seed)
    uniform = search(tmp_path / "uniform", "uniform", CountingEvaluator(), budget=30, seed=seed)
    assert learned.best is not None and uniform.best is not None
    assert learned.best.score >= uniform.best.score


def test_learned_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    for run in ("a", "b", "c"):
        search(tmp_path / run, "learned", CountingEvaluator(), budget=12, seed=0 if run != "c" else 1)
    assert masks_in_order(tmp_path / "a", "learned") == masks_in_order(tmp_path / "b", "learned")
    assert masks_in_order(tmp_path / "a", "learned") != masks_in_order(tmp_path / "c", "learned")


def test_warm_start_enqueues_the_best_cached_baselines(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    search(tmp_path / "uniform", "uniform", CountingEvaluator(), budget=20, cache_dir=cache)
    space = load_space("sparse").resolve(NUM_LAYERS)
    ranked = sorted(space.uniform_masks(), key=lambda m: -synthetic_score(m, synthetic_profile(m)).value)
    evaluate = CountingEvaluator()
    strategy = LearnedStrategy(warm_start=True, warm_start_size=2)
    search(tmp_path / "learned", strategy, evaluate, budget=6, cache_dir=cache)
    frame = study_trials_frame(load_study(tmp_path / "learned", "learned"))
    assert list(frame["mask"][:2]) == [str(m) for m in ranked[:2]]
    assert list(frame["origin"][:2]) == ["plan", "plan"] and frame["cache_hit"][:2].all()
    assert len(evaluate.calls) == 4  # the warm start came from the cache
    cold = CountingEvaluator()
    search(tmp_path / "cold", strategy, cold, budget=4)
    assert cold.calls[:2] == [str(m) for m in space.uniform_masks(2)]


def test_nsga2_sampler_runs(tmp_path: Path) -> None:
    result = search(tmp_path, LearnedStrategy(algorithm="nsga2"), CountingEvaluator(), budget=6)
    assert result.budget_used == 6


@pytest.mark.parametrize("algorithm", ["gp", "cmaes"])
def test_gp_and_cmaes_samplers_run_past_their_startup_trials(tmp_path: Path, algorithm: str) -> None:
    """scipy and cmaes are pinned dependencies: the samplers offered are the samplers installed."""
    strategy = LearnedStrategy(algorithm=algorithm, n_startup_trials=3)
    result = search(tmp_path, strategy, CountingEvaluator(), budget=8)
    frame = study_trials_frame(load_study(tmp_path, "learned"))
    assert result.budget_used == 8 and (frame["origin"] == "sampler").sum() >= 5


def test_repeats_are_free_and_the_guard_breaks_a_stuck_sampler(tmp_path: Path) -> None:
    evaluate = CountingEvaluator()
    result = search(tmp_path, StuckStrategy(), evaluate, space="contiguous", budget=4, max_idle_asks=3)
    frame = study_trials_frame(load_study(tmp_path, "stuck"))
    assert result.budget_used == 4 and len(evaluate.calls) == len(set(evaluate.calls)) == 4
    assert frame["repeat"].sum() == 9 and frame[frame["repeat"]]["cache_hit"].all()
    assert list(frame[~frame["repeat"]]["origin"]) == ["sampler", "guard", "guard", "guard"]


@pytest.mark.parametrize("strategy", ["random", "learned"])
def test_every_layer_scores_the_no_skip_draft_first_and_once(tmp_path: Path, strategy: str) -> None:
    """Outside the space (which skips at least one layer), one mask of the budget, never again on
    resume; without `every_layer` the space's masks only (test_random_strategy_...)."""
    evaluate, empty = CountingEvaluator(), str(SkipMask(NUM_LAYERS))
    result = search(tmp_path, strategy, evaluate, budget=6, every_layer=True)
    assert evaluate.calls[0] == empty and evaluate.calls.count(empty) == 1
    assert result.budget_used == 6 and len(evaluate.calls) == 6
    frame = study_trials_frame(load_study(tmp_path, strategy))
    assert frame.loc[frame["mask"] == empty, "origin"].tolist() == ["every-layer"]
    # in the sparse space's own params (every layer kept), so GP and CMA-ES keep one search space
    first = load_study(tmp_path, strategy).trials[0]
    assert first.user_attrs["mask"] == empty and first.params and not any(first.params.values())
    more = CountingEvaluator()
    result = search(tmp_path, strategy, more, budget=8, every_layer=True, resume=True)
    assert result.budget_used == 8 and empty not in more.calls and len(more.calls) == 2


def test_infeasible_asks_are_constrained_and_cost_no_budget(tmp_path: Path) -> None:
    evaluate = CountingEvaluator()
    result = search(tmp_path, StuckStrategy(), evaluate, budget=3, max_idle_asks=2)
    study = load_study(tmp_path, "stuck")
    infeasible = [t for t in study.trials if not t.user_attrs["feasible"]]
    assert len(infeasible) == 6 and all(t.constraints["infeasibility"] > 0 for t in infeasible)
    assert result.budget_used == len(evaluate.calls) == 3
    assert study.best_trial.user_attrs["feasible"]


def test_a_shared_cache_serves_another_study(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = search(tmp_path / "a", "uniform", CountingEvaluator(), cache_dir=cache)
    again = CountingEvaluator()
    second = search(tmp_path / "b", "uniform", again, cache_dir=cache)
    assert again.calls == [] and second.budget_used == first.budget_used
    assert second.model_evaluations == 0
    assert study_trials_frame(load_study(tmp_path / "b", "uniform"))["cache_hit"].all()


@pytest.mark.parametrize("strategy", [make_strategy("learned"), StuckStrategy()])
def test_the_loop_keeps_capacity_masks_in_flight(tmp_path: Path, strategy: Strategy) -> None:
    evaluate = CountingEvaluator()
    space = load_space("contiguous" if isinstance(strategy, StuckStrategy) else "sparse").resolve(NUM_LAYERS)
    with ParallelExecutor(evaluate, capacity=3) as executor:
        result = run_study(
            space, strategy, executor, synthetic_score, tmp_path, SearchConfig(budget=8, max_idle_asks=2)
        )
    study = load_study(tmp_path, strategy.name)
    assert result.budget_used == len(evaluate.calls) == len(set(evaluate.calls)) == 8
    assert executor.max_in_flight == 3
    assert not study.get_trials(states=(TrialState.RUNNING,))
    frame = study_trials_frame(study)
    for _, repeat in frame[frame["repeat"]].iterrows():  # told with the values of the first
        first = frame[(frame["mask"] == repeat["mask"]) & ~frame["repeat"]].iloc[0]
        assert repeat["score"] == first["score"]


# -- failures and resume -----------------------------------------------------------------------
def test_an_evaluation_error_fails_the_trial_and_resume_finishes(tmp_path: Path) -> None:
    class Broken(CountingEvaluator):
        def __call__(self, mask: SkipMask) -> AcceptanceProfile:
            if len(self.calls) == 2:
                raise RuntimeError("out of memory")
            return super().__call__(mask)

    with pytest.raises(RuntimeError, match="out of memory"):
        search(tmp_path, "random", Broken(), budget=5)
    failed = load_study(tmp_path, "random").get_trials(states=(TrialState.FAIL,))
    assert len(failed) == 1 and "out of memory" in failed[0].user_attrs["error"]
    evaluate = CountingEvaluator()
    result = search(tmp_path, "random", evaluate, budget=5, resume=True)
    assert result.budget_used == 5 and len(evaluate.calls) == 3


def test_resume_needs_the_flag_and_the_same_settings(tmp_path: Path) -> None:
    search(tmp_path, "random", CountingEvaluator(), budget=3)
    with pytest.raises(ConfigError, match="--resume"):
        search(tmp_path, "random", CountingEvaluator(), budget=3)
    with pytest.raises(ConfigError, match="seed=0"):
        search(tmp_path, "random", CountingEvaluator(), budget=3, seed=1, resume=True)
    more = CountingEvaluator()
    result = search(tmp_path, "random", more, budget=6, resume=True)
    assert result.budget_used == 6 and len(more.calls) == 3


@pytest.mark.slow
def test_resume_after_sigkill_never_reevaluates_a_finished_mask(tmp_path: Path) -> None:
    run_dir, log = tmp_path / "run", tmp_path / "calls.log"
    script = CRASH_SCRIPT.format(root=str(REPOSITORY), run=str(run_dir), log=str(log))
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)], cwd=REPOSITORY)
    deadline = time.monotonic() + 60
    while not log.with_suffix(".hanging").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the study subprocess did not start"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()

    study = load_study(run_dir, "learned")
    finished = {  # infeasible proposals complete too, unevaluated: they cost no budget
        t.user_attrs["mask"]
        for t in study.get_trials(states=(TrialState.COMPLETE,))
        if t.user_attrs.get("feasible", True)
    }
    (running,) = study.get_trials(states=(TrialState.RUNNING,))
    assert len(finished) == 3 and log.read_text().splitlines()[3] == running.user_attrs["mask"]

    evaluate = CountingEvaluator()
    result = search(run_dir, "learned", evaluate, budget=8, resume=True)
    frame = study_trials_frame(load_study(run_dir, "learned"))
    assert result.budget_used == 8 and len(frame[~frame["repeat"]]) == 8
    assert not finished & set(evaluate.calls) and len(evaluate.calls) == 5
    assert running.user_attrs["mask"] in evaluate.calls
    assert "retry" in set(frame["origin"])
    assert load_study(run_dir, "learned").trials[running.number].state == TrialState.FAIL


# -- results -----------------------------------------------------------------------------------
def test_pareto_mode_returns_a_non_dominated_front(tmp_path: Path) -> None:
    result = search(tmp_path, "learned", CountingEvaluator(), budget=25, pareto=True)
    study = load_study(tmp_path, "learned")
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    front = result.pareto_front
    records = study_trials_frame(study)
    assert front and [r.r_draft for r in front] == sorted(r.r_draft for r in front)
    for r in front:
        dominated = (records["score"] >= r.score) & (records["r_draft"] <= r.r_draft)
        assert not (dominated & ((records["score"] > r.score) | (records["r_draft"] < r.r_draft))).any()
    front_masks = {r.mask for r in front}
    for _, row in records[~records["mask"].isin(front_masks)].iterrows():
        assert any(r.score >= row["score"] and r.r_draft <= row["r_draft"] for r in front)


def test_trials_frame_best_trial_and_progress(tmp_path: Path) -> None:
    progress: list[tuple[int, int, float | None]] = []
    space = load_space("sparse").resolve(NUM_LAYERS)
    with LocalExecutor(CountingEvaluator()) as executor:
        result = run_study(
            space,
            make_strategy("random"),
            executor,
            synthetic_score,
            tmp_path,
            SearchConfig(budget=5, seed=2),
            on_trial=lambda *args: progress.append(args),
        )
    study = load_study(tmp_path, "random")
    frame = study_trials_frame(study)
    assert len(frame) == 5 and {"mask", "score", "gamma_best", "r_draft", "gamma_1", "alpha"} <= set(frame)
    assert set(frame["strategy"]) == {"random"} and not frame["cache_hit"].any()
    best = best_trial(study)
    assert best == result.best and best is not None and best.score == frame["score"].max()
    assert best.per_gamma[best.gamma_best] == best.score and best.details["alpha"] > 0
    assert [p[0] for p in progress] == [1, 2, 3, 4, 5] and {p[1] for p in progress} == {5}
    assert progress[-1][2] == best.score
    with pytest.raises(ConfigError, match="no study 'learned'"):
        load_study(tmp_path, "learned")
    with pytest.raises(ConfigError, match="holds no study journal"):
        load_study(tmp_path / "nowhere", "random")
