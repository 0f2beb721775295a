"""Search for skip masks: strategies, the Optuna study loop, the evaluation cache, results.

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
