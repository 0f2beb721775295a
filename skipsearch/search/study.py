"""The search loop: Optuna ask/tell in the driver, masks evaluated by an Executor
(docs/architecture.md, "Data flow").

Storage is an Optuna journal file under the run directory (`optuna-dashboard optuna.journal`
reads it). The budget is the number of distinct masks the study scores; the evaluation cache
decides whether scoring one costs a model call, and a mask the study has scored before is told
again at no cost.

Feasibility goes to Optuna with `trial.set_constraint` (a value > 0 marks the trial infeasible):
in optuna 5 TPE, GP and NSGA-II read it from the trial, TPE ranks infeasible trials by how far out
they are, and `best_trial(s)` skip them; pruning would hide them from GP and tell TPE nothing about
the distance. Infeasible masks are never evaluated and cost no budget. The objective told for one
is `infeasible_value`; only CMA-ES, which ignores constraints, and GP's objective model see it.

Resume: trials left RUNNING by a killed driver are marked FAIL and their params re-enqueued;
finished trials are read back, never re-evaluated. One driver per study at a time.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.config import COMPARE_KIND, RUN_KIND, load_run_file
from skipsearch.errors import ConfigError
from skipsearch.executors.base import Executor, Outcome
from skipsearch.masks import FULL_BITS, SkipMask, SublayerWeights
from skipsearch.search.evaluation_cache import EvaluationCache
from skipsearch.search.journal import FlockLock, repair_journal
from skipsearch.search.results import DETAIL_PREFIX, TrialRecord, best_trial, pareto_front
from skipsearch.search.score import Scorer
from skipsearch.search.spaces import ConcreteSpace
from skipsearch.search.strategies import PlanContext, Strategy
from skipsearch.search.subset_spaces import SubsetSpace
from skipsearch.store import CACHE_DIR, JOURNAL_FILE, RUN_FILE, refuse_symlinks

logger = logging.getLogger(__name__)

CONSTRAINT = "infeasibility"
EVERY_LAYER = "every-layer"  # the origin of the trial that scores the draft skipping no layer
# Trial attrs set when a trial is asked; the rest describe its score and are copied to repeats.
_ASK_ATTRS = ("mask", "num_layers", "strategy", "seed", "origin")

ProgressCallback = Callable[[int, int, float | None], None]
"""`on_trial(scored, budget, best_value)`, called after each trial that used budget."""


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna at WARNING for the block, its previous level back after it.

    Optuna logs a line per trial; a search reports its trials through `on_trial` (the CLI's progress
    bar) instead. Optuna's level is process-wide and cannot be given to a study, so it is set around
    the search and restored, never left changed for the rest of the process.
    """
    previous = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(previous)


@dataclass(frozen=True)
class SearchConfig:
    """How one study runs.

    `pareto`: maximise the score and minimise r_draft (weighted by `r_draft_weights`, e.g. from a
    LatencyProfile; by sub-layer count without). `max_idle_asks`: after this many asks in a row
    that cost no budget (repeats, infeasible), the next mask is a random unseen feasible one.
    `every_layer`: score the draft that skips no layer first, outside the space (whose masks skip
    at least one): a candidate where drafts also differ by vocabulary or KV pattern, whose
    savings need no skipped layer (its verify reuses every layer's K/V). It costs one mask of the
    budget.
    """

    budget: int
    seed: int = 0
    pareto: bool = False
    r_draft_weights: SublayerWeights | None = None
    infeasible_value: float = 0.0
    max_idle_asks: int = 20
    every_layer: bool = False

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ConfigError(
                f"budget must be a positive number of evaluations, got {self.budget}: pass e.g. 60"
            )
        if self.max_idle_asks < 1:
            raise ConfigError(f"max_idle_asks must be >= 1, got {self.max_idle_asks}")


@dataclass(frozen=True)
class StudyOutcome:
    """How a run ended: `budget_used` distinct masks scored (all sessions), `model_evaluations`
    of them measured in this session (the rest came from the cache), `exhausted` when the strategy
    had nothing new to propose before the budget was spent."""

    study_name: str
    journal: Path
    budget_used: int
    model_evaluations: int
    exhausted: bool
    best: TrialRecord | None
    pareto_front: tuple[TrialRecord, ...]


def journal_storage(run_dir: Path) -> JournalStorage:
    """The run's journal, repaired first if a killed writer tore its last record (so nothing is
    ever appended after a torn line); refused when a file of the run is a symlink, which the
    appends and the repair would write through."""
    run_dir.mkdir(parents=True, exist_ok=True)
    refuse_symlinks(run_dir)
    path = run_dir / JOURNAL_FILE
    repair_journal(path)
    try:  # Optuna replays every record on its first read: a damaged one fails here, in one line
        storage = JournalStorage(JournalFileBackend(str(path), lock_obj=FlockLock(path)))
        optuna.study.get_all_study_names(storage)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        raise ConfigError(
            f"{path} is damaged: a record is whole JSON but not an Optuna journal operation "
            f"({type(error).__name__}: {error}); restore the file from a copy, or start a new run in "
            "another --out"
        ) from None
    return storage


def stored_kind(run_dir: Path) -> str:
    """`run` or `compare`: the command that made `run_dir` (a run where its `run.yaml` cannot say)."""
    try:
        return COMPARE_KIND if load_run_file(run_dir / RUN_FILE)[2] is not None else RUN_KIND
    except ConfigError:
        return RUN_KIND


def load_study(run_dir: Path, study_name: str) -> optuna.Study:
    """A finished or running study, for reading its results."""
    if not (run_dir / JOURNAL_FILE).is_file():
        raise ConfigError(f"{run_dir} holds no study journal ({JOURNAL_FILE}): pass the directory of a run")
    storage = journal_storage(run_dir)
    names = optuna.study.get_all_study_names(storage)
    if not names:
        raise ConfigError(
            f"{run_dir / JOURNAL_FILE} holds no study: the run stopped before its first trial was "
            f"recorded, or the file was emptied; continue it with `skipsearch {stored_kind(run_dir)} --out "
            f"{run_dir} --resume`, or start it again in another --out"
        )
    if study_name not in names:
        raise ConfigError(
            f"{run_dir} has no study {study_name!r}: it has {', '.join(names) or 'none'} "
            "(pick one with --study NAME)"
        )
    return optuna.load_study(study_name=study_name, storage=storage)


def run_study(
    space: ConcreteSpace,
    strategy: Strategy,
    executor: Executor,
    scorer: Scorer,
    run_dir: Path,
    config: SearchConfig,
    *,
    study_name: str | None = None,
    cache: EvaluationCache | None = None,
    resume: bool = False,
    on_trial: ProgressCallback | None = None,
) -> StudyOutcome:
    """Search `space` with `strategy` until `config.budget` distinct masks are scored.

    The study is `study_name` (default: the strategy's name) in `run_dir/optuna.journal`; the cache
    defaults to `run_dir/cache`. With `resume`, an existing study is continued to the budget;
    without, finding one is an error so a run is never extended by accident.
    """
    cache = cache if cache is not None else EvaluationCache(run_dir / CACHE_DIR)
    # Plan before touching the journal, so a strategy that cannot run leaves no study behind.
    search = _Search(space, strategy, executor, scorer, config, cache, on_trial)
    study = _open_study(run_dir, study_name or strategy.name, strategy, space, config, resume)
    return search.run(study, run_dir / JOURNAL_FILE)


def _settings(strategy: Strategy, space: ConcreteSpace, config: SearchConfig) -> dict[str, Any]:
    """What a resumed study must share with the one it continues (the budget may grow)."""
    settings = {**strategy.options(), "space": space.to_dict(), "seed": config.seed, "pareto": config.pareto}
    return json.loads(json.dumps(settings))


def _sampler(strategy: Strategy, seed: int, pareto: bool) -> optuna.samplers.BaseSampler:
    """The strategy's sampler; a plan-only strategy gets a random one that Optuna never consults,
    since every trial it asks is enqueued."""
    return strategy.sampler(seed, pareto) or optuna.samplers.RandomSampler(seed)


def _open_study(
    run_dir: Path, name: str, strategy: Strategy, space: ConcreteSpace, config: SearchConfig, resume: bool
) -> optuna.Study:
    """Create the study, or reopen it to resume: same settings, a reseeded sampler, and trials a
    killed driver left RUNNING marked FAIL with their params enqueued again."""
    storage = journal_storage(run_dir)
    settings = _settings(strategy, space, config)
    if name not in optuna.study.get_all_study_names(storage):
        directions = ["maximize", "minimize"] if config.pareto else ["maximize"]
        sampler = _sampler(strategy, config.seed, config.pareto)
        study = optuna.create_study(storage=storage, study_name=name, directions=directions, sampler=sampler)
        study.set_user_attr("settings", settings)
        return study
    if not resume:
        raise ConfigError(
            f"{run_dir / JOURNAL_FILE} already holds study {name!r}: resume it (--resume) or use a new run"
        )
    stored = optuna.load_study(study_name=name, storage=storage)
    for key, value in stored.user_attrs.get("settings", {}).items():
        if settings.get(key) != value:
            raise ConfigError(
                f"study {name!r} in {run_dir} was run with {key}={value!r}, not {settings.get(key)!r}: "
                "resume with the same settings or use a new run directory"
            )
    # Reseed so a resumed sampler does not replay the proposals it made before the crash.
    sampler = _sampler(strategy, config.seed + len(stored.trials), config.pareto)
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(trial.number, state=TrialState.FAIL)
        if trial.params:
            logger.info(
                "trial %d was left running by a crash: marked FAIL, asking its mask again", trial.number
            )
            study.enqueue_trial(trial.params, user_attrs={"origin": "retry"})
    return study


class _Search:
    """One run of the loop: the plan, and what the study has scored or has in flight."""

    def __init__(
        self,
        space: ConcreteSpace,
        strategy: Strategy,
        executor: Executor,
        scorer: Scorer,
        config: SearchConfig,
        cache: EvaluationCache,
        on_trial: ProgressCallback | None,
    ) -> None:
        self.space, self.strategy, self.executor, self.scorer = space, strategy, executor, scorer
        self.config, self.cache, self.on_trial = config, cache, on_trial
        self.seen: set[str] = set()  # scored or in flight
        self.scored: dict[str, FrozenTrial] = {}  # mask -> the trial that first scored it
        self.in_flight: dict[str, optuna.Trial] = {}
        self.repeats_in_flight: dict[str, list[optuna.Trial]] = defaultdict(list)
        self.idle_asks = 0
        self.evaluations = 0
        self.best_value: float | None = None
        self.every_layer = SkipMask(space.num_layers) if config.every_layer else None
        # A subset space expresses that draft in its own params (every unit kept): samplers that
        # need one search space over all trials (GP, CMA-ES) would otherwise sample the rest at random.
        self.every_layer_params = (
            space.params_for(self.every_layer)
            if self.every_layer is not None
            and isinstance(space, SubsetSpace)
            and FULL_BITS in space.precisions
            else None
        )
        self.space_size = space.size() + (self.every_layer is not None)
        self.learns = strategy.sampler(config.seed, config.pareto) is not None
        self.plan = strategy.plan(
            PlanContext(space, config.seed, config.budget, self.seen, self._cached_value)
        )

    def _remember(self, key: str, trial: FrozenTrial) -> None:
        self.scored[key] = trial
        self.seen.add(key)
        score = trial.user_attrs["score"]
        self.best_value = score if self.best_value is None else max(self.best_value, score)

    def _cached_value(self, mask: SkipMask) -> float | None:
        cached = self.cache.get(mask)
        return None if cached is None else self.scorer(mask, cached.profile).value

    # -- the loop -----------------------------------------------------------------------------
    def run(self, study: optuna.Study, journal: Path) -> StudyOutcome:
        self.study = study
        study.set_user_attr("budget", self.config.budget)  # for `report`: is the study complete?
        self.guard_rng = np.random.default_rng([self.config.seed, len(study.trials)])
        for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if trial.user_attrs.get("feasible") and not trial.user_attrs.get("repeat"):
                self._remember(trial.user_attrs["mask"], trial)
        exhausted = False
        while True:
            room = len(self.in_flight) < self.executor.capacity
            if room and not exhausted and len(self.scored) + len(self.in_flight) < self.config.budget:
                exhausted = not self._ask()
            elif self.in_flight:
                self._collect(self.executor.wait_any())
            else:
                break
        if exhausted:
            study.set_user_attr("exhausted", True)
            logger.warning(
                "strategy %s has nothing new to propose: stopped after %d of a budget of %d masks",
                self.strategy.name,
                len(self.scored),
                self.config.budget,
            )
        return StudyOutcome(
            study_name=self.study.study_name,
            journal=journal,
            budget_used=len(self.scored),
            model_evaluations=self.evaluations,
            exhausted=exhausted,
            best=best_trial(self.study),
            pareto_front=tuple(pareto_front(self.study)),
        )

    def _next_trial(self) -> optuna.Trial | None:
        """Enqueue the next plan or guard mask when the queue is empty, then ask; None: done."""
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return self.study.ask()
        if self.every_layer is not None and str(self.every_layer) not in self.seen:
            if self.every_layer_params is not None:
                self.study.enqueue_trial(self.every_layer_params, user_attrs={"origin": EVERY_LAYER})
                return self.study.ask()
            trial = self.study.ask()  # no params: the space cannot express the mask
            trial.set_user_attr("origin", EVERY_LAYER)
            return trial
        if len(self.seen) >= self.space_size:
            return None
        if self.idle_asks >= self.config.max_idle_asks:
            logger.info("%d asks in a row cost no budget: proposing a random unseen mask", self.idle_asks)
            self.idle_asks = 0
            return self._enqueue_and_ask(self.space.random_unseen(self.guard_rng, self.seen), "guard")
        planned = next((m for m in self.plan if str(m) not in self.seen), None)
        if planned is not None:
            return self._enqueue_and_ask(planned, "plan")
        return self.study.ask() if self.learns else None

    def _enqueue_and_ask(self, mask: SkipMask | None, origin: str) -> optuna.Trial | None:
        if mask is None:
            return None
        self.study.enqueue_trial(self.space.params_for(mask), user_attrs={"origin": origin})
        return self.study.ask()

    def _ask(self) -> bool:
        """Ask one trial and tell it at once, or submit its mask; False when nothing is left."""
        trial = self._next_trial()
        if trial is None:
            return False
        every_layer = trial.user_attrs.get("origin") == EVERY_LAYER
        mask = (
            self.every_layer if every_layer and self.every_layer_params is None else self.space.suggest(trial)
        )
        key = str(mask)
        attrs = {
            "mask": key,
            "num_layers": mask.num_layers,
            "strategy": self.strategy.name,
            "seed": self.config.seed,
        }
        attrs["origin"] = trial.user_attrs.get("origin", "sampler")
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        violation = 0.0 if every_layer else self.space.violation(mask)
        if violation > 0:
            self.idle_asks += 1
            values = [self.config.infeasible_value, *self._cost(mask)]
            self._tell(trial, values, {"feasible": False, "violation": violation}, violation)
        elif key in self.scored:
            self.idle_asks += 1
            self._tell_repeat(trial, self.scored[key])
        elif key in self.in_flight:
            self.idle_asks += 1
            self.repeats_in_flight[key].append(trial)
        elif (cached := self.cache.get(key)) is not None:
            self._tell_scored(trial, mask, cached.profile, cached.seconds, cache_hit=True)
        else:
            self.executor.submit(mask)
            self.in_flight[key] = trial
            self.seen.add(key)
        return True

    def _collect(self, outcome: Outcome) -> None:
        key = str(outcome.mask)
        trial = self.in_flight.pop(key)
        if isinstance(outcome.result, Exception):
            for failed in [trial, *self.repeats_in_flight.pop(key, [])]:
                failed.set_user_attr("error", repr(outcome.result))
                self.study.tell(failed, state=TrialState.FAIL)
            raise outcome.result
        self.cache.put(key, outcome.result, outcome.seconds)
        self.evaluations += 1
        self._tell_scored(trial, outcome.mask, outcome.result, outcome.seconds, cache_hit=False)

    # -- telling ------------------------------------------------------------------------------
    def _cost(self, mask: SkipMask) -> list[float]:
        """The second objective in Pareto mode."""
        return [mask.r_draft(self.config.r_draft_weights)] if self.config.pareto else []

    def _tell(
        self, trial: optuna.Trial, values: list[float], attrs: dict[str, Any], violation: float
    ) -> FrozenTrial:
        for name, value in attrs.items():
            trial.set_user_attr(name, value)
        trial.set_constraint(CONSTRAINT, violation)
        return self.study.tell(trial, values)

    def _tell_scored(
        self, trial: optuna.Trial, mask: SkipMask, profile: AcceptanceProfile, seconds: float, cache_hit: bool
    ) -> None:
        score = self.scorer(mask, profile)
        attrs = {
            "feasible": True,
            "cache_hit": cache_hit,
            "repeat": False,
            "eval_seconds": seconds,
            "score": score.value,
            "gamma_best": score.gamma_best,
            "per_gamma": {str(g): v for g, v in score.per_gamma.items()},
            "r_draft": mask.r_draft(self.config.r_draft_weights),
            **{f"{DETAIL_PREFIX}{k}": v for k, v in score.details.items()},
        }
        key = str(mask)
        first = self._tell(trial, [score.value, *self._cost(mask)], attrs, 0.0)
        self._remember(key, first)
        self.idle_asks = 0
        logger.debug("trial %d: %s scored %.4f (cache hit: %s)", first.number, key, score.value, cache_hit)
        if self.on_trial is not None:
            self.on_trial(len(self.scored), self.config.budget, self.best_value)
        for waiting in self.repeats_in_flight.pop(key, []):
            self._tell_repeat(waiting, first)

    def _tell_repeat(self, trial: optuna.Trial, first: FrozenTrial) -> None:
        attrs = {k: v for k, v in first.user_attrs.items() if k not in _ASK_ATTRS}
        attrs.update(cache_hit=True, repeat=True, eval_seconds=0.0)
        assert first.values is not None
        self._tell(trial, list(first.values), attrs, 0.0)
