"""`skipsearch run` and `compare` end to end: validate, measure, search, write the run directory.

Order matters for "nothing half-written": every input is validated (space file, budget, run
directory, constraints against the model's depth) before `run.yaml` or the study journal is
created, and the report files are rewritten from the journal at the end, so a killed run loses
nothing that `--resume` cannot rebuild.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, ExecutorFactory, local_executor
from skipsearch.progress import console
from skipsearch.store import CACHE_DIR, DRAFT_VOCAB_FILE, JOURNAL_FILE, RUN_FILE

if TYPE_CHECKING:  # heavy (torch) or Optuna types: imported where they are used
    from skipsearch.acceptance.worker import Measurement
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.search import EvaluationCache
    from skipsearch.search.study import SearchResult


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

    measurement: Measurement
    latency: LatencyProfile | None
    provenance: dict


def open_context(config: RunConfig, strategies: Sequence[str] | None = None) -> RunContext:
    """Load the model and ReferenceCache; find the latency profile for the calibrated cost.

    The scoring context is checked against the profile before the model loads, and the search
    space is resolved against the model's depth (with the strategy's needs) before the reference
    build, so bad input fails before anything is written.
    """
    import torch
    import transformers

    from skipsearch.acceptance.worker import prepare
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.search.objective import scoring_latency
    from skipsearch.search.space_files import load_space
    from skipsearch.store import default_profile_path

    space = load_space(config.space)
    latency_path = default_profile_path(config.measure.model, config.measure.device)
    latency = LatencyProfile.load(latency_path) if latency_path.is_file() else None
    scoring_latency(_concrete_cost(config.cost, latency), latency, config.context, config.extrapolate_context)
    # Infeasible constraints depend on the depth: check them before any run file is written.
    chosen = strategies or (config.strategy,)
    measurement = prepare(config.measure, check=lambda layers: check_search(config, chosen, space, layers))
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

    return replace(config, cost=_concrete_cost(config.cost, context.latency))


def _concrete_cost(cost: str, latency: object | None) -> str:
    if cost != "auto":
        return cost
    return "calibrated" if latency is not None else "closed-form"


def check_search(config: RunConfig, strategies: Sequence[str], space_file: object, num_layers: int) -> None:
    """What depends on the model's depth: the space's constraints and, for the informed strategies,
    a sparse or sublayer space with budget left after a measured importance."""
    from skipsearch.search.space_spec import TierSpace
    from skipsearch.search.strategies import INFORMED, informed_space, measured_units_budget

    resolved = space_file.resolve(num_layers)  # type: ignore[attr-defined]
    space = resolved.base if isinstance(resolved, TierSpace) else resolved
    for strategy in (s for s in strategies if s in INFORMED):
        spent = measured_units_budget(informed_space(strategy, space), config.importance)
        if config.budget <= spent:
            raise ConfigError(
                f"--importance measured evaluates {spent} single-unit masks of space {space.name!r} "
                f"from the budget of {config.budget}: raise --budget above {spent} or use --importance proxy"
            )


def resolve_draft_vocab(config: RunConfig) -> RunConfig:
    """The draft vocabularies the run scores every mask with, made concrete before `run.yaml`:
    `--draft-vocab` when given, else the space file's `draft_vocab:` (full only for a tiers space,
    whose masks are captured with the full head). The measurement measures every size given."""
    from dataclasses import replace

    from skipsearch.search.space_files import load_space
    from skipsearch.search.space_spec import SpaceSpec

    choices = config.draft_vocab
    if choices is None:
        spec = load_space(config.space)
        choices = spec.draft_vocab if isinstance(spec, SpaceSpec) else (None,)
    sizes = tuple(k for k in choices if k is not None)
    return replace(config, draft_vocab=tuple(choices), measure=replace(config.measure, draft_vocabs=sizes))


def save_run(config: RunConfig, context: RunContext, out: Path, extra: dict | None = None) -> None:
    """`run.yaml` with its provenance, and the draft-vocabulary ranking the run drafts from."""
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / RUN_FILE, {**context.provenance, **(extra or {})})
    if config.measure.draft_vocabs:
        context.measurement.ranking.save(out / DRAFT_VOCAB_FILE)


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
    cache: EvaluationCache | None = None,
    on_trial: Callable[[int, int, float | None], None] | None = None,
    executor: Executor | None = None,
) -> SearchResult:
    """Run one strategy's study in `out` (validated constraints first, then the journal).

    Masks are evaluated on `executor` (the caller closes it), by default in this process."""
    import optuna

    from skipsearch.cost.closed_forms import head_share_from_config
    from skipsearch.search import EvaluationCache, SearchConfig, run_search
    from skipsearch.search.objective import make_scorer
    from skipsearch.search.space_files import load_space
    from skipsearch.search.space_spec import TierSpace

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the progress bar reports trials
    measurement = context.measurement
    resolved = load_space(config.space).resolve(measurement.num_layers)
    space = resolved.base if isinstance(resolved, TierSpace) else resolved
    model_config = measurement.runner.config
    scorer = make_scorer(
        config.objective,
        config.cost,
        context.latency,
        config.gamma_max,
        config.context,
        config.extrapolate_context,
        draft_vocab=config.draft_vocab or (None,),
        vocab_size=int(model_config.vocab_size),
        head_share=None if context.latency else head_share_from_config(model_config.to_dict()),
    )
    cache = cache if cache is not None else EvaluationCache(out / CACHE_DIR)
    owned = local_executor(config.measure, config.temperature, measurement) if executor is None else None
    with owned or nullcontext(executor) as evaluating:
        strategy, budget = _strategy(config, context, space, out, evaluating, cache)
        search = SearchConfig(budget=budget, seed=config.seed, pareto=config.pareto)
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
        from skipsearch.search.tier_sets import search_space_tiers

        search_space_tiers(out, resolved, config.cost, context.latency, seed=config.seed)
    return result


def _strategy(
    config: RunConfig, context: RunContext, space: object, out: Path, executor: Executor, cache: object
) -> tuple[object, int]:
    """The strategy with its options and inputs, and the study's budget: an informed strategy
    gets the run's importance (measuring it first takes the single-unit masks from the budget) and,
    with the calibrated cost, each sub-layer's time at the scoring context."""
    from skipsearch.run.importance import run_importance
    from skipsearch.search.objective import DEFAULT_CONTEXT, scoring_latency
    from skipsearch.search.strategies import (
        INFORMED,
        informed_space,
        make_strategy,
        measured_units_budget,
    )

    if config.strategy == "learned":
        return make_strategy("learned", algorithm=config.sampler, warm_start=config.warm_start), config.budget
    if config.strategy not in INFORMED:
        return make_strategy(config.strategy), config.budget
    subset = informed_space(config.strategy, space)  # type: ignore[arg-type]
    importance = run_importance(out, config.importance, context.measurement, subset, executor, cache)  # type: ignore[arg-type]
    latency = scoring_latency(config.cost, context.latency, config.context, config.extrapolate_context)
    at = DEFAULT_CONTEXT if config.context is None else config.context
    weights = latency.weights(at) if config.cost == "calibrated" and latency is not None else None  # type: ignore[attr-defined]
    strategy = make_strategy(config.strategy, importance=importance, weights=weights)
    return strategy, config.budget - measured_units_budget(subset, config.importance)


COMPARED_STRATEGIES = ("random", "uniform", "ranking", "knapsack", "learned", "knapsack+tpe")


def run_compare(
    config: RunConfig,
    seeds: int,
    out: Path,
    resume: bool,
    progress: Callable[[str], object],
    executor_factory: ExecutorFactory = local_executor,
    strategies: Sequence[str] = COMPARED_STRATEGIES,
    random_multiple: int = 0,
) -> list[tuple[str, int, str]]:
    """Every strategy × seed with the same budget in one journal, sharing one evaluation cache
    (a mask measured for one strategy is free for the others) and one executor, whose workers
    load the model once for all studies. `random_multiple` > 1 adds random search at that multiple
    of the budget (label `random@<m>x`), the reference a learned strategy should beat.
    Returns (label, seed, study)."""
    from dataclasses import replace

    from skipsearch.search import EvaluationCache
    from skipsearch.search.space_files import load_space
    from skipsearch.search.strategies import STRATEGIES

    if seeds < 1:
        raise ConfigError(f"--seeds must be >= 1, got {seeds}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ConfigError(f"unknown strategies {unknown or strategies}: use some of {', '.join(STRATEGIES)}")
    if random_multiple < 0 or random_multiple == 1:
        raise ConfigError(f"--random-multiple must be 0 (none) or >= 2, got {random_multiple}")
    check_run_dir(out, resume)
    if resume:
        config = resumed_config(out, config.budget)
    load_space(config.space)
    config = resolve_draft_vocab(config)
    context = open_context(config, strategies)
    config = resolve_cost(config, context)
    console.print(cost_note(config, context))
    studies_of = [(s, s, config.budget) for s in strategies]
    if random_multiple:
        studies_of.append((f"random@{random_multiple}x", "random", config.budget * random_multiple))
    save_run(config, context, out, {"seeds": seeds, "strategies": [label for label, _, _ in studies_of]})
    cache = EvaluationCache(out / CACHE_DIR)
    studies = []
    with executor_factory(config.measure, config.temperature, context.measurement) as executor:
        for seed in range(config.seed, config.seed + seeds):
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
