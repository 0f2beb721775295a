"""One strategy's search inside a run directory: what `run.pipeline` and `run.compare` call once
the model is loaded.

`RunContext` is what a measured model hands the search (the latency profile priced at the run's
context, the scorer over it, each strategy's search, the space file), shared by the strategies of a
compare. `search_one` runs one study in the run directory: the strategy with its inputs (an informed
one gets the run's importance and, with the calibrated cost, each sub-layer's time), on an executor,
scored by the run's objective (`build_scorer`, or `run_scorer` for a script's variant of the
config); `rescore_finalists` then re-scores the study's best drafts exactly while the model is still
loaded (`run.finalists`).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.config import RunConfig
from skipsearch.executors.base import Executor, local_executor
from skipsearch.progress import console
from skipsearch.run.finalists import FINALISTS, Finalist
from skipsearch.run.preflight import SearchSetup, build_search
from skipsearch.search.space_spec import SpaceSpec, TierSpec
from skipsearch.search.study import ProgressCallback, StudyOutcome
from skipsearch.store import CACHE_DIR

if TYPE_CHECKING:  # heavy (torch) types: imported where they are used
    from skipsearch.acceptance.worker import Measurement
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.search import EvaluationCache
    from skipsearch.search.score import Scorer
    from skipsearch.search.strategies import Strategy


@dataclass
class RunContext:
    """A measured model plus everything the search needs, shared by the strategies of a compare:
    the latency profile found (`latency`) and the one priced at the run's context (`scoring`), the
    scorer over it, each strategy's search at the model's depth (`setups`) and the space file."""

    measurement: Measurement
    latency: LatencyProfile | None
    provenance: dict
    scoring: LatencyProfile | None
    scorer: Scorer
    setups: dict[str, SearchSetup]
    space: SpaceSpec | TierSpec


def search_one(
    config: RunConfig,
    context: RunContext,
    out: Path,
    resume: bool,
    study_name: str | None = None,
    cache: EvaluationCache | None = None,
    on_trial: ProgressCallback | None = None,
    executor: Executor | None = None,
    every_layer: bool = False,
    setup: SearchSetup | None = None,
) -> StudyOutcome:
    """Run one strategy's study in `out` (validated constraints first, then the journal).

    Masks are evaluated on `executor` (the caller closes it), by default in this process.
    `every_layer` scores the draft that skips no layer first (`SearchConfig.every_layer`): `run`
    asks for it (`run.pipeline._drafts_beyond_layers`); `compare` does not, since a candidate every strategy
    scores first would make them all find the same best when it wins. `setup`: the search as the
    run's checks built it (`RunContext.setups`); else built here in the context's space file, for
    a compare's study with its own seed and budget."""
    from skipsearch.search import EvaluationCache, SearchConfig, run_study
    from skipsearch.search.space_spec import TierSpace
    from skipsearch.search.study import quiet_optuna

    with quiet_optuna():  # trials are reported by `on_trial`, not by Optuna's log
        measurement = context.measurement
        if setup is None:
            setup = build_search(config, context.space, measurement.num_layers)
        cache = cache if cache is not None else EvaluationCache(out / CACHE_DIR)
        owned = local_executor(config.measure, config.temperature, measurement) if executor is None else None
        with owned or nullcontext(executor) as evaluating:
            strategy, budget = _strategy(config, context, setup, out, evaluating, cache)
            search = SearchConfig(
                budget=budget,
                seed=config.seed,
                pareto=config.pareto,
                every_layer=every_layer,
            )
            result = run_study(
                setup.space,
                strategy,
                evaluating,
                context.scorer,
                out,
                search,
                study_name=study_name,
                cache=cache,
                resume=resume,
                on_trial=on_trial,
            )
        if isinstance(setup.resolved, TierSpace):  # tier sets over the masks the base search measured
            from skipsearch.search.tier_sets import search_space_tiers

            search_space_tiers(out, setup.resolved, config.cost, context.latency, seed=config.seed)
    return result


def run_scorer(config: RunConfig, context: RunContext) -> Scorer:
    """`config`'s objective under its cost model over the context's model and priced latency: the
    context's own `scorer` for its own config (a script scores variants of it)."""
    return build_scorer(config, context.measurement, context.latency, context.scoring)


def build_scorer(
    config: RunConfig,
    measurement: Measurement,
    latency: LatencyProfile | None,
    scoring: LatencyProfile | None,
) -> Scorer:
    """The run's objective under its cost model over `scoring` (`latency` priced at the run's
    context), as the search and the finalists' re-score use it."""
    from skipsearch.cost.closed_forms import head_share_from_config
    from skipsearch.search.objective import DEFAULT_CONTEXT, model_kv_share, priced_scorer
    from skipsearch.tree_shapes import parse_trees

    runner = measurement.runner
    model_config = runner.config
    at = DEFAULT_CONTEXT if config.context is None else config.context
    return priced_scorer(
        config.objective,
        config.cost,
        scoring,
        at,
        config.gamma_max,
        draft_vocab=config.draft_vocab or (None,),
        vocab_size=int(model_config.vocab_size),
        head_share=None if latency else head_share_from_config(model_config.to_dict()),
        kv=config.kv or (None,),
        kv_share=None if latency else model_kv_share(runner.model, at),
        gamma_min=config.gamma_min or 1,
        trees=parse_trees(config.trees),
    )


def rescore_finalists(config: RunConfig, context: RunContext, out: Path) -> list[Finalist] | None:
    """Re-score the search's best drafts exactly (`run.finalists`) while the model is loaded; the
    verdict ranks by that score. Skipped, with a line saying why, where the driver holds no live
    model (released to Ray GPU workers) or no reference K/V (`--mode self`): then None, and the
    report reads whatever finalists.json a previous session of the run left."""
    from skipsearch.acceptance.measure_config import MODES_WITH_KV
    from skipsearch.run.finalists import rescore, save_finalists
    from skipsearch.search import load_study
    from skipsearch.search.results import trial_records

    measurement = context.measurement
    if config.measure.mode not in MODES_WITH_KV or measurement.model_released:
        console.print(
            "finalists not re-scored: the rounds estimator needs the model and the reference K/V here"
        )
        return None
    records = [r for r in trial_records(load_study(out, config.strategy)) if not r.repeat]
    with console.status(
        f"re-scoring the {min(FINALISTS, len(records))} best drafts with the rounds estimator"
    ):
        finalists = rescore(records, measurement, context.scorer, config.temperature)
    save_finalists(out, finalists)
    return finalists


def _strategy(
    config: RunConfig,
    context: RunContext,
    setup: SearchSetup,
    out: Path,
    executor: Executor,
    cache: EvaluationCache,
) -> tuple[Strategy, int]:
    """The strategy with its inputs, and the study's budget: an informed strategy gets the run's
    importance (measuring it first takes the single-unit masks from the budget) and, with the
    calibrated cost, each sub-layer's time at the scoring context."""
    from skipsearch.run.importance_file import run_importance
    from skipsearch.search.objective import DEFAULT_CONTEXT
    from skipsearch.search.strategies import informed_space, make_strategy, measured_units_budget

    if setup.strategy is not None:
        return setup.strategy, config.budget
    subset = informed_space(config.strategy, setup.space)
    importance = run_importance(out, config.importance, context.measurement, subset, executor, cache)
    latency = context.scoring
    at = DEFAULT_CONTEXT if config.context is None else config.context
    weights = latency.weights(at) if config.cost == "calibrated" and latency is not None else None
    strategy = make_strategy(config.strategy, importance=importance, weights=weights)
    return strategy, config.budget - measured_units_budget(subset, config.importance)
