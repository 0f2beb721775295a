"""Search for skip masks (docs/search.md): spaces, strategies, the Optuna study loop, scoring, the
evaluation cache and the stored results.

Example (a synthetic evaluator and scorer stand in for the model and the cost model)::

    from pathlib import Path
    from skipsearch.executors.base import LocalExecutor
    from skipsearch.search import SearchConfig, make_strategy, run_study
    from skipsearch.search.space_files import load_space

    space = load_space("sparse").resolve(num_layers=30)
    with LocalExecutor(evaluate) as executor:
        result = run_study(space, make_strategy("learned"), executor, score, Path("runs/demo"),
                            SearchConfig(budget=60, seed=0))
    print(result.best.mask, result.best.score)

Modules:
- `space_spec`: what a space file says, before it meets a model (`SpaceSpec`, `TierSpec`).
- `space_files`: reading and validating a space file's YAML (shipped ones in `builtin_spaces/`).
- `spaces`: the concrete set of masks one space file allows for one model: the shared base, early
  exits (`contiguous`) and runs of layers (`block`).
- `subset_spaces`: any subset of layers or sub-layers (`sparse`, `sublayer`), and `mixed`, which also
  chooses each sub-layer's precision.
- `space_precision`: the precisions a space names (`full`, `int8`, `int4`) and the masks that carry them.
- `strategies`: who proposes the next mask (`random`, `uniform`, `learned`, `exhaustive`, ...).
- `knapsack`: the least important units to skip or quantize for every amount of draft cost saved (pure).
- `study`: the search loop: Optuna ask/tell in the driver, masks evaluated by an Executor.
- `journal`: repair an Optuna journal a killed writer left torn.
- `score`: `Scorer` and `Score`: what the search maximises, from a mask's AcceptanceProfile.
- `objective`: the default scorers: predicted speedup (closed form or calibrated) or acceptance.
- `evaluation_cache`: mask string -> AcceptanceProfile, persisted as JSONL, so repeats are free.
- `results`: a study read back: one `TrialRecord` per trial, the table, best and Pareto front.
- `stored`: a run directory read back: its config, every study's trials, its AcceptanceProfiles.
- `tier_sets`: the tier-set search over masks a run already evaluated: Optuna over simulations.

Terms: a *space* is the set of masks a search may propose; a *strategy* proposes them; a *trial*
is one evaluated mask and its score; the *budget* counts model evaluations (a cached mask is free).
"""

from skipsearch.search.evaluation_cache import CachedEvaluation, EvaluationCache
from skipsearch.search.results import (
    TrialRecord,
    best_trial,
    pareto_front,
    study_trials_frame,
    trial_records,
)
from skipsearch.search.score import Score, Scorer
from skipsearch.search.strategies import (
    STRATEGIES,
    ExhaustiveStrategy,
    LearnedStrategy,
    PlanContext,
    RandomStrategy,
    Strategy,
    UniformStrategy,
    make_strategy,
)
from skipsearch.search.study import ProgressCallback, SearchConfig, StudyOutcome, load_study, run_study

__all__ = [
    "STRATEGIES",
    "CachedEvaluation",
    "EvaluationCache",
    "ExhaustiveStrategy",
    "LearnedStrategy",
    "PlanContext",
    "ProgressCallback",
    "RandomStrategy",
    "Score",
    "Scorer",
    "SearchConfig",
    "Strategy",
    "StudyOutcome",
    "TrialRecord",
    "UniformStrategy",
    "best_trial",
    "load_study",
    "make_strategy",
    "pareto_front",
    "run_study",
    "study_trials_frame",
    "trial_records",
]
