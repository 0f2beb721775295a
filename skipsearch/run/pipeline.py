"""`skipsearch run` and `compare` end to end: validate, measure, search, write the run directory.

One descent (`start_run`): the run directory is locked for this command alone (`run_owner`); the
space file is loaded once and everything that needs no model is checked once (`prepare_config`,
`preflight`), each strategy's search built at the model's depth where it is known; the model loads
(`open_context`), the depth-dependent checks running right after it when only the weights tell the
depth, before the slow reference build; the scoring (the latency profile priced at the run's
context, and the scorer over it) is built once; only then are `run.yaml` and the study journal
written; the search, the finalists' re-score (both `run.search_step`'s) and the report files follow,
and the report is handed back as written (`run.report.RunReport`), not read again.

A new run that still fails before its first trial (a Ray cluster that does not start, an interrupt
while loading) removes what it created, so the rerun is not told to `--resume` a run that never
ran. The report files are rewritten from the journal at the end, so a killed run loses nothing that
`--resume` cannot rebuild.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from skipsearch.config import CompareSettings, RunConfig
from skipsearch.errors import ConfigError
from skipsearch.executors.base import ExecutorFactory, local_executor
from skipsearch.masks import KVPattern
from skipsearch.options import SEED_LIMIT
from skipsearch.progress import console, status
from skipsearch.run.cost_estimate import SearchClock
from skipsearch.run.owner import run_owner
from skipsearch.run.preflight import (
    RESUME_CHANGES,
    SearchSetup,
    check_searches,
    preflight,
    resumed_config,
)
from skipsearch.run.report import RunReport, write_run_outputs
from skipsearch.run.search_step import RunContext, build_scorer, rescore_finalists, search_one
from skipsearch.search.space_spec import SpaceSpec, TierSpec
from skipsearch.search.study import ProgressCallback, StudyOutcome, journal_storage
from skipsearch.store import DRAFT_VOCAB_FILE, RUN_FILE

log = logging.getLogger(__name__)


def resolve_space_settings(config: RunConfig, loaded: SpaceSpec | TierSpec | None = None) -> RunConfig:
    """The settings a space file gives and the command line may override, made concrete before
    `run.yaml`: the draft vocabularies and KV patterns every mask is scored with (`--draft-vocab` /
    `--kv-window` when given, else the space file's `draft_vocab:` / `kv:`; full only for a tiers
    space, whose masks are captured with the full head and cache), and the draft lengths a mask's
    best γ is chosen from (`--gamma-max` when given, else the space's `gamma_max:`; the space's
    `gamma_min:`). The measurement measures every size and pattern given.

    A KV pattern is priced at the run's `--context` and must be measured there: a pattern measured
    on prompts it covers is exact, and priced at a longer context it would look free. So a run with
    patterns needs `--context`, and prompts cut to at least that many tokens.

    `loaded`: the space file, as the run loaded it (loaded here when not given).
    """
    from skipsearch.search.space_files import load_space

    loaded = load_space(config.space) if loaded is None else loaded
    tiers = isinstance(loaded, TierSpec)
    spec = loaded.base if tiers else loaded
    vocabs = config.draft_vocab if config.draft_vocab is not None else (None,) if tiers else spec.draft_vocab
    patterns = config.kv if config.kv is not None else (None,) if tiers else spec.kv
    trees = config.trees if config.trees is not None else () if tiers else tuple(map(str, spec.tree))
    measure = replace(
        config.measure,
        draft_vocabs=tuple(k for k in vocabs if k is not None),
        kv_patterns=tuple(kv for kv in patterns if kv is not None),
    )
    if measure.kv_patterns:
        _check_kv_context(config.context, measure.prompts.max_prompt_tokens, measure.kv_patterns)
    gamma_max = spec.gamma_max if config.gamma_max is None else config.gamma_max
    gamma_min = spec.gamma_min if config.gamma_min is None else config.gamma_min
    if gamma_min > gamma_max:
        raise ConfigError(
            f"--gamma-max {gamma_max} is below the space's gamma_min={gamma_min} ({spec.source}): pass "
            f"--gamma-max {gamma_min} or more, or lower gamma_min in the space file"
        )
    return replace(
        config,
        draft_vocab=tuple(vocabs),
        kv=tuple(patterns),
        trees=tuple(trees),
        measure=measure,
        gamma_min=gamma_min,
        gamma_max=gamma_max,
    )


def _drafts_beyond_layers(config: RunConfig) -> bool:
    """Whether drafts also differ by draft vocabulary or KV pattern, ranked by the calibrated cost
    model: then the draft that skips no layer is a candidate too (it can win: every layer with a
    smaller draft vocabulary's head is cheaper than the full step, and accepts nearly all). The
    closed form cannot rank it: its round, `γ r_draft + (1 − r_reuse) f(γ)`, leaves out the verify's
    pass of the last draft token through the reused layers, so at `r_reuse` = 1 it prices the verify
    at nothing (the calibrated model and the engine pay it)."""
    has_more = bool(config.measure.draft_vocabs or config.measure.kv_patterns)
    return has_more and config.cost == "calibrated"


def _searches_kv(config: RunConfig) -> bool:
    return any(kv is not None for kv in config.kv or ())


def _check_kv_context(context: int | None, prompt_tokens: int, patterns: Sequence[KVPattern]) -> None:
    example = " ".join(str(kv) for kv in patterns)
    if context is None:
        raise ConfigError(
            f"KV patterns ({example}) are priced at a context: give --context N, the number of "
            "cached tokens the drafts will run at (e.g. 8192)"
        )
    if prompt_tokens < context:
        raise ConfigError(
            f"KV patterns are measured at the context they are priced at: --max-prompt-tokens "
            f"{prompt_tokens} is below --context {context}; pass --max-prompt-tokens {context} with "
            "prompts that long (--prompts stdlib-long)"
        )


@dataclass(frozen=True)
class PreparedRun:
    """A run (or compare) checked without its model: the config it will use, its space file (loaded
    once), the compare's settings, the strategies it searches with, and their searches built at the
    model's depth where that is known before loading (`preflight.Checked`)."""

    config: RunConfig
    space: SpaceSpec | TierSpec
    compare: CompareSettings | None
    strategies: tuple[str, ...]
    depth: int | None
    setups: dict[str, SearchSetup] | None
    changes: tuple[dict, ...] = ()  # what resumes changed (`preflight.RESUME_CHANGES`), this one's last


def prepare_config(
    config: RunConfig,
    out: Path,
    resume: bool,
    typed: Mapping[str, str],
    compare: CompareSettings | None = None,
) -> PreparedRun:
    """What a run (or, with `compare`, a compare) will use, with every model-free check done once:
    the stored settings of a resumed one (`typed` as in `resumed_config`), the space's settings,
    the cost model, the search of each strategy it runs, the device. The run directory itself is
    `run_owner`'s."""
    from skipsearch.search.space_files import load_space

    changes: tuple[dict, ...] = ()
    if resume:
        resumed = resumed_config(out, config, typed, compare)
        config, compare, changes = resumed.config, resumed.compare, resumed.changes
        if resumed.this is not None:
            change = resumed.this
            status.print(
                f"resume: {change['setting']} {change['from']} -> {change['to']} (recorded in {RUN_FILE})"
            )
        journal_storage(out)  # a damaged journal fails now, before the model loads and run.yaml is rewritten
    strategies = (config.strategy,) if compare is None else compare_strategies(compare)
    if compare is not None:
        check_compare(config, compare)
    space = load_space(config.space)
    checked = preflight(resolve_space_settings(config, space), space, strategies)
    return PreparedRun(
        checked.config, space, compare, tuple(strategies), checked.depth, checked.setups, changes
    )


def open_context(prepared: PreparedRun | RunConfig) -> RunContext:
    """Load the model and ReferenceCache; find the latency profile for the calibrated cost.

    The scoring context is checked against the profile (and priced, once) before the model loads,
    and the search of each strategy is built against the model's depth as soon as it is known (where
    `preflight` could not know it), so infeasible constraints or an exhaustive space beyond the
    budget fail before the reference build and before anything is written. A bare config (a
    script's, already through `resolve_space_settings`) has its space file loaded here.
    """
    import torch
    import transformers

    from skipsearch.acceptance.worker import prepare
    from skipsearch.cost.latency import LatencyProfile
    from skipsearch.models.kernels import plan_kernels
    from skipsearch.models.loading import dtype_name
    from skipsearch.search.objective import scoring_latency
    from skipsearch.store import readable_profile_path

    if isinstance(prepared, RunConfig):
        from skipsearch.search.space_files import load_space

        prepared = PreparedRun(prepared, load_space(prepared.space), None, (prepared.strategy,), None, None)
    config = prepared.config
    measure = config.measure
    latency_path = readable_profile_path(
        measure.model, measure.device, dtype_name(measure.device, measure.dtype), config.graphs
    )
    latency = LatencyProfile.load(latency_path) if latency_path.is_file() else None
    scoring = scoring_latency(
        config.cost, latency, config.context, config.extrapolate_context, _searches_kv(config)
    )
    setups = dict(prepared.setups or {})

    def check(depth: int) -> None:
        if depth != prepared.depth or not setups:  # built now where the weights alone tell the depth
            setups.update(check_searches(config, prepared.space, depth, prepared.strategies))

    measurement = prepare(config.measure, check=check)
    if latency is not None:
        latency.warn_other_plan(plan_kernels(measurement.loaded.model), latency_path)
    provenance = {
        "model_source": measurement.loaded.source,
        **measurement.loaded.plan.to_record(),
        "num_layers": measurement.num_layers,
        "prompt_set": config.measure.prompts.key(),
        "reference_cache": measurement.reference_path,
        "latency_profile": str(latency_path) if latency else None,
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
    }
    if prepared.changes:
        provenance[RESUME_CHANGES] = [dict(change) for change in prepared.changes]
    scorer = build_scorer(config, measurement, latency, scoring)
    return RunContext(measurement, latency, provenance, scoring, scorer, setups, prepared.space)


def save_run(
    config: RunConfig, context: RunContext, out: Path, compare: CompareSettings | None = None
) -> None:
    """`run.yaml` with its kind and provenance, and the draft-vocabulary ranking the run drafts from."""
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / RUN_FILE, context.provenance, compare)
    if config.measure.draft_vocabs:
        context.measurement.ranking.save(out / DRAFT_VOCAB_FILE)


def start_run(
    config: RunConfig,
    out: Path,
    resume: bool,
    typed: Mapping[str, str],
    make_executor: ExecutorFactory,
    on_start: Callable[[RunConfig], ProgressCallback | None],
) -> tuple[StudyOutcome, RunReport]:
    """`skipsearch run`, the module's one descent: check, load, write `run.yaml`, search to the
    budget in `out`, re-score the finalists, write the report; the study's outcome and the report.

    `on_start(config)` is called once the model is loaded (with the run's final config) and
    returns the per-trial progress callback."""
    with run_owner(out, resume):
        clock = SearchClock(config.budget)
        prepared = prepare_config(config, out, resume, typed)
        config = prepared.config
        every_layer = _drafts_beyond_layers(config)
        clock.untimed = int(every_layer and not resume)  # scored first, and cheaper than a trial
        context = open_context(prepared)
        if make_executor is local_executor:  # a Ray worker holds its own model and makes its own
            make_draft_copies(context, config)
        status.print(cost_note(config, context))
        save_run(config, context, out)
        with make_executor(config.measure, config.temperature, context.measurement) as executor:
            result = search_one(
                config,
                context,
                out,
                resume,
                on_trial=timed_progress(clock, on_start(config)),
                executor=executor,
                every_layer=every_layer,
                setup=context.setups[config.strategy],
            )
        finalists = rescore_finalists(config, context, out)  # still the owner: it writes into the run
        report = write_run_outputs(out, stored=(config, context.provenance), finalists=finalists)
    return result, report


def make_draft_copies(context: RunContext, config: RunConfig) -> None:
    """Make the int8/int4 copies of every layer the space's precisions read before the search (for
    drafts measured in this process): they are made once either way, but inside the first
    trials they made those trials read as twice a trial's time, and `run`'s first estimates 22-47%
    long (the demo: 3.7 and 4.8 s against a steady 2.3). Copies that would not fit in memory are
    left to the trials that need them, as before."""
    from skipsearch.masks import LOW_BITS

    runner = context.measurement.runner
    space = context.setups[config.strategy].space
    for bits in (b for b in getattr(space, "precisions", ()) if b in LOW_BITS):
        try:
            runner.prepare_every_layer(bits)  # the copies and their fused paths
        except ConfigError as error:
            log.info("int%d copies left to the trials that read them: %s", bits, error)
            return


def timed_progress(clock: SearchClock, on_trial: ProgressCallback | None) -> ProgressCallback | None:
    """The progress callback with the search's cost beside it (`run.cost_estimate`): the line the
    clock has once the model is ready, then its estimates as the trials time it; nothing where the
    caller shows no progress (`on_trial` None)."""
    if on_trial is None:
        return None
    console.print(clock.loaded())

    def on_timed_trial(scored: int, budget: int, best: float | None) -> None:
        line = clock.trial(scored, budget)
        if line is not None:
            console.print(line)
        on_trial(scored, budget, best)

    return on_timed_trial


def cost_note(config: RunConfig, context: RunContext) -> str:
    """One line for the console: which cost model ranks the masks, and how to calibrate if it is not."""
    if config.cost == "calibrated":
        return f"cost model: calibrated on this device ({context.provenance['latency_profile']})"
    hint = (
        "" if context.latency else f"; run `skipsearch profile --model {config.measure.model}` to calibrate"
    )
    return f"cost model: closed form (counts sub-layers, not this device's times){hint}"


def compare_strategies(compare: CompareSettings) -> tuple[str, ...]:
    """The strategies a compare searches with (random search at a multiple of the budget too)."""
    extra = ("random",) if compare.random_multiple else ()
    return tuple(dict.fromkeys((*compare.strategies, *extra)))


def check_compare(config: RunConfig, compare: CompareSettings) -> None:
    """A compare's own settings against what the strategies and seeds can be: known strategies,
    and seeds `seed .. seed + seeds - 1` all in the samplers' range."""
    from skipsearch.search.strategies import STRATEGIES

    unknown = [s for s in compare.strategies if s not in STRATEGIES]
    if unknown:
        raise ConfigError(
            f"unknown strategy {unknown[0]!r} in --strategies: use some of {', '.join(STRATEGIES)}"
        )
    last = config.seed + compare.seeds - 1
    if last >= SEED_LIMIT:
        raise ConfigError(
            f"--seed {config.seed} with --seeds {compare.seeds} runs seeds up to {last}, past the samplers' "
            f"{SEED_LIMIT - 1}: pass --seed {SEED_LIMIT - compare.seeds} or less"
        )
