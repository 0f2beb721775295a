"""`skipsearch compare`: several strategies × seeds at the same budget, in one run directory.

The studies share one journal, one evaluation cache (a mask measured for one strategy is free for
the others) and one executor, whose workers load the model once for all of them; everything else
is `run.pipeline`'s (each study `run.search_step`'s), which also checks the compare's own settings
(`check_compare`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from skipsearch.config import CompareSettings, RunConfig
from skipsearch.executors.base import ExecutorFactory, local_executor
from skipsearch.progress import status
from skipsearch.run.owner import run_owner
from skipsearch.run.pipeline import (
    PreparedRun,
    check_compare,
    cost_note,
    open_context,
    prepare_config,
    save_run,
)
from skipsearch.run.search_step import search_one
from skipsearch.search.study import ProgressCallback
from skipsearch.store import CACHE_DIR


def run_compare(
    config: RunConfig,
    compare: CompareSettings,
    out: Path,
    resume: bool,
    progress: Callable[[str], ProgressCallback],
    executor_factory: ExecutorFactory = local_executor,
    typed: Mapping[str, str] | None = None,
) -> list[tuple[str, int, str]]:
    """Every strategy × seed of `compare` with the same budget in one journal, sharing one
    evaluation cache (a mask measured for one strategy is free for the others) and one executor,
    whose workers load the model once for all studies. A `random_multiple` > 1 adds random search
    at that multiple of the budget (label `random@<m>x`), the reference a learned strategy should
    beat. A resume restores the stored settings, those of `compare` included (`typed` as in
    `resumed_config`). Returns (label, seed, study)."""
    check_compare(config, compare)
    with run_owner(out, resume):
        prepared = prepare_config(config, out, resume, typed or {}, compare)
        return _compare(prepared, out, resume, progress, executor_factory)


def _compare(
    prepared: PreparedRun,
    out: Path,
    resume: bool,
    progress: Callable[[str], ProgressCallback],
    executor_factory: ExecutorFactory,
) -> list[tuple[str, int, str]]:
    from skipsearch.search import EvaluationCache

    config, compare = prepared.config, prepared.compare
    assert compare is not None  # prepare_config keeps the compare it was given
    studies_of = [(s, s, config.budget) for s in compare.strategies]
    if compare.random_multiple:
        multiple = compare.random_multiple
        studies_of.append((f"random@{multiple}x", "random", config.budget * multiple))
    context = open_context(prepared)
    status.print(cost_note(config, context))
    save_run(config, context, out, compare)
    cache = EvaluationCache(out / CACHE_DIR)
    studies = []
    with executor_factory(config.measure, config.temperature, context.measurement) as executor:
        for seed in range(config.seed, config.seed + compare.seeds):
            for label, strategy, budget in studies_of:
                name = f"{label.replace('@', '-')}-s{seed}"
                one = replace(config, strategy=strategy, seed=seed, budget=budget)
                has_study = resume and name in _study_names(out)
                search_one(
                    one,
                    context,
                    out,
                    has_study,
                    study_name=name,
                    cache=cache,
                    on_trial=progress(name),
                    executor=executor,
                )
                studies.append((label, seed, name))
    return studies


def _study_names(out: Path) -> list[str]:
    import optuna

    from skipsearch.search.study import journal_storage

    return optuna.study.get_all_study_names(journal_storage(out))
