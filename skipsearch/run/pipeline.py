"""`skipsearch run` and `compare` end to end: validate, measure, search, write the run directory.

Order matters for "nothing half-written": every input is validated (space file, budget, run
directory, constraints against the model's depth) before `run.yaml` or the study journal is
created, and the report files are rewritten from the journal at the end, so a killed run loses
nothing that `--resume` cannot rebuild.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, ExecutorFactory, local_executor
from skipsearch.progress import console
from skipsearch.store import JOURNAL_FILE, RUN_FILE


def check_run_dir(out: Path, resume: bool) -> None:
    """A run directory is either new, or an existing run continued with `--resume`."""
    exists = (out / RUN_FILE).is_file() or (out / JOURNAL_FILE).is_file()
    if exists and not resume:
        raise ConfigError(f"{out} already holds a run: pass --resume to continue it, or another --out")
    if resume and not exists:
        raise ConfigError(f"{out} holds no run to resume: drop --resume to start one there")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file: pass a directory")


@dataclass
class RunContext:
    """A measured model plus everything the search needs, shared by the strategies of a compare."""

    measurement: object  # skipsearch.measurement.Measurement
    latency: object | None  # skipsearch.costmodel.LatencyProfile
    provenance: dict


def open_context(config: RunConfig) -> RunContext:
    """Load the model and ReferenceCache; find the latency profile for the calibrated cost.

    The search space is resolved against the model's depth first, so infeasible constraints
    fail before the reference build and before anything is written.
    """
    import torch
    import transformers

    from skipsearch.acceptance.worker import prepare
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.models.loading import dtype_name
    from skipsearch.search.space_files import load_space
    from skipsearch.store import readable_profile_path

    space = load_space(config.space)
    # Infeasible constraints depend on the depth: check them before any run file is written.
    measurement = prepare(config.measure, check=space.resolve)
    measure = config.measure
    latency_path = readable_profile_path(
        measure.model, measure.device, dtype_name(measure.device, measure.dtype)
    )
    latency = LatencyProfile.load(latency_path) if latency_path.is_file() else None
    provenance = {
        "model_source": measurement.loaded.source,
        "num_layers": measurement.num_layers,
        "prompt_set": config.measure.prompts.key(),
        "reference_cache": measurement.reference_path,
        "latency_profile": str(latency_path) if latency else None,
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
    }
    return RunContext(measurement, latency, provenance)


def resolve_cost(config: RunConfig, context: RunContext) -> RunConfig:
    """`--cost auto` made concrete before `run.yaml` is written: the calibrated cost model when
    `skipsearch profile` has measured this model on this device, else the closed form.

    A resumed run reloads its `run.yaml` (`resumed_config`), where the cost is already concrete,
    so a profile taken in between cannot change how half of one study's trials are scored.
    """
    from dataclasses import replace

    if config.cost != "auto":
        return config
    return replace(config, cost="calibrated" if context.latency is not None else "closed-form")


def resumed_config(out: Path, budget: int) -> RunConfig:
    """The settings a run started with, from its `run.yaml`: only the budget may change on resume,
    or one study would mix trials scored, measured or constrained in two ways."""
    return RunConfig.load(out / RUN_FILE)[0].with_budget(budget)


def cost_note(config: RunConfig, context: RunContext) -> str:
    """One line for the console: which cost model ranks the masks, and how to calibrate if it is not."""
    if config.cost == "calibrated":
        return f"cost model: calibrated on this device ({context.provenance['latency_profile']})"
    hint = (
        "" if context.latency else f"; run `skipsearch profile --model {config.measure.model}` to calibrate"
    )
    return f"cost model: closed form (counts sub-layers, not this device's times){hint}"


def search_one(
    config: RunConfig,
    context: RunContext,
    out: Path,
    resume: bool,
    study_name: str | None = None,
    cache: object | None = None,
    on_trial: Callable[[int, int, float | None], None] | None = None,
    executor: Executor | None = None,
) -> object:
    """Run one strategy's study in `out` (validated constraints first, then the journal).

    Masks are evaluated on `executor` (the caller closes it), by default in this process."""
    import optuna

    from skipsearch.search import SearchConfig, make_strategy, run_search
    from skipsearch.search.objective import make_scorer
    from skipsearch.search.space_files import load_space
    from skipsearch.search.space_spec import TierSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar reports trials
    measurement = context.measurement
    resolved = load_space(config.space).resolve(measurement.num_layers)
    space = resolved.base if isinstance(resolved, TierSpace) else resolved
    options = (
        {"algorithm": config.sampler, "warm_start": config.warm_start} if config.strategy == "learned" else {}
    )
    strategy = make_strategy(config.strategy, **options)
    scorer = make_scorer(config.objective, config.cost, context.latency, config.gamma_max)
    search = SearchConfig(budget=config.budget, seed=config.seed, pareto=config.pareto)
    owned = local_executor(config.measure, config.temperature, measurement) if executor is None else None
    with owned or nullcontext(executor) as evaluating:
        result = run_search(
            space,
            strategy,
            evaluating,
            scorer,
            out,
            search,
            study_name=study_name,
            cache=cache,
            resume=resume,
            on_trial=on_trial,
        )
    if isinstance(resolved, TierSpace):  # tier sets over the masks the base search measured
        from skipsearch.tiers.search import search_space_tiers

        search_space_tiers(out, resolved, config.cost, context.latency, seed=config.seed)
    return result


COMPARED_STRATEGIES = ("random", "uniform", "learned")


def run_compare(
    config: RunConfig,
    seeds: int,
    out: Path,
    resume: bool,
    progress: Callable[[str], object],
    executor_factory: ExecutorFactory = local_executor,
) -> list[tuple[str, int, str]]:
    """Every strategy × seed with the same budget in one journal, sharing one evaluation cache
    (a mask measured for one strategy is free for the others) and one executor, whose workers
    load the model once for all studies. Returns (strategy, seed, study)."""
    from dataclasses import replace

    from skipsearch.search import EvaluationCache
    from skipsearch.search.space_files import load_space

    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    check_run_dir(out, resume)
    if resume:
        config = resumed_config(out, config.budget)
    load_space(config.space)
    context = open_context(config)
    config = resolve_cost(config, context)
    console.print(cost_note(config, context))
    out.mkdir(parents=True, exist_ok=True)
    config.save(
        out / RUN_FILE, {**context.provenance, "seeds": seeds, "strategies": list(COMPARED_STRATEGIES)}
    )
    cache = EvaluationCache(out / "cache")
    studies = []
    with executor_factory(config.measure, config.temperature, context.measurement) as executor:
        for seed in range(config.seed, config.seed + seeds):
            for strategy in COMPARED_STRATEGIES:
                name = f"{strategy}-s{seed}"
                one = replace(config, strategy=strategy, seed=seed)
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
                studies.append((strategy, seed, name))
    return studies


def _study_names(out: Path) -> list[str]:
    import optuna

    from skipsearch.search.study import journal_storage

    return optuna.study.get_all_study_names(journal_storage(out))
