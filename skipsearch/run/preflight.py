"""What a run can check without its model: checked before the model loads and before the run
directory is touched, so bad input costs seconds and leaves nothing behind.

Order: the stored settings of a resumed run, the cost model against the profiles on disk, the
search (space, strategy, sampler packages, budget) against the model's depth when the registry or
a local `config.json` knows it, then the device (the first check that imports torch). A model whose
depth only its weights tell (a hub id, a `.gguf`) gets the depth checks right after loading, before
the slow reference build (`open_context`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skipsearch.config import CompareSettings, RunConfig, load_run_file
from skipsearch.cost.latency import LatencyProfile
from skipsearch.errors import ConfigError
from skipsearch.models.device import check_device
from skipsearch.models.loading import dtype_name
from skipsearch.models.registry import REGISTRY
from skipsearch.search.objective import AUTO_COST
from skipsearch.search.space_spec import SpaceSpec, TierSpace, TierSpec
from skipsearch.search.spaces import ConcreteSpace
from skipsearch.search.strategies import (
    INFORMED,
    PlanContext,
    Strategy,
    informed_space,
    make_strategy,
    measured_units_budget,
)
from skipsearch.store import RUN_FILE, check_cache_dir, readable_profile_path


@dataclass(frozen=True)
class SearchSetup:
    """A run's search made concrete for a depth: the space it resolves to (`base` of a tier
    space is what the masks are searched in) and the strategy with its sampler — None for an
    informed strategy (ranking, knapsack), whose importance needs the loaded model."""

    resolved: ConcreteSpace | TierSpace
    strategy: Strategy | None

    @property
    def space(self) -> ConcreteSpace:
        return self.resolved.base if isinstance(self.resolved, TierSpace) else self.resolved


def build_search(config: RunConfig, space: SpaceSpec | TierSpec, num_layers: int) -> SearchSetup:
    """The search of `config` in `space` (its space file, loaded once: `run.pipeline`) at
    `num_layers`, with everything that can refuse it checked now: infeasible constraints, sampler
    packages, CMA-ES with --pareto, an exhaustive plan beyond the budget, an informed strategy on a
    space it cannot rank or a measured importance that would spend the whole budget."""
    resolved = space.resolve(num_layers)
    if config.strategy in INFORMED:
        setup = SearchSetup(resolved, None)
        spent = measured_units_budget(informed_space(config.strategy, setup.space), config.importance)
        if config.budget <= spent:
            raise ConfigError(
                f"--importance measured evaluates {spent} single-unit masks of space "
                f"{setup.space.name!r} from the budget of {config.budget}: raise --budget above {spent} "
                "or use --importance proxy"
            )
        return setup
    options = (
        {"algorithm": config.sampler, "warm_start": config.warm_start} if config.strategy == "learned" else {}
    )
    setup = SearchSetup(resolved, make_strategy(config.strategy, **options))
    setup.strategy.sampler(config.seed, config.pareto)
    setup.strategy.plan(PlanContext(setup.space, config.seed, config.budget, frozenset(), lambda mask: None))
    return setup


def known_depth(model: str) -> int | None:
    """The decoder depth of a registry alias or a local model directory, without loading weights."""
    if model in REGISTRY:
        return REGISTRY[model].num_layers
    config_path = Path(model) / "config.json"
    if not config_path.is_file():
        return None
    try:
        depth = json.loads(config_path.read_text()).get("num_hidden_layers")
    except (OSError, ValueError, AttributeError):
        return None  # the model loader says what is wrong with it
    return depth if isinstance(depth, int) and depth > 0 else None


def resolve_cost(config: RunConfig) -> RunConfig:
    """`--cost auto` made concrete before `run.yaml` is written: the calibrated cost model when
    `skipsearch profile` has measured this model on this device, else the closed form; and
    `--cost calibrated` without a profile refused before the model loads. With `--graphs` the
    profile is the one of CUDA-graph replays (`profile --graphs`), which must exist.

    A resumed run reloads its `run.yaml` (`resumed_config`), where the cost is already concrete,
    so a profile taken in between cannot change how half of one study's trials are scored.
    """
    measure = config.measure
    dtype = dtype_name(measure.device, measure.dtype)
    path = readable_profile_path(measure.model, measure.device, dtype, config.graphs)
    profiled = path.is_file()
    if (config.cost == "calibrated" or config.graphs) and not profiled:
        asked, flag, instead = (
            ("--graphs", " --graphs", "drop --graphs")
            if config.graphs
            else ("--cost calibrated", "", "use --cost closed-form")
        )
        raise ConfigError(
            f"{asked} needs a latency profile of {measure.model} on {measure.device}, and {path} does not "
            f"exist: run `skipsearch profile --model {measure.model} --device {measure.device}{flag}` "
            f"first, or {instead}"
        )
    if config.cost == AUTO_COST:
        config = replace(config, cost="calibrated" if profiled else "closed-form")
    if config.cost == "calibrated":
        check_gamma_priced(config.gamma_max, LatencyProfile.load(path), path)
    return config


def check_gamma_priced(gamma_max: int | None, latency: LatencyProfile, path: Path) -> None:
    """The calibrated cost prices a round's verify over γ + 1 positions from the profile's measured
    position counts: a γ past what it measured would be priced by extrapolation, so it is refused
    (the profiler measures 1..9, 12, 16, 24 and 32 positions by default: `gamma_max` up to 31)."""
    reach = max(latency.positions) - 1
    if gamma_max is not None and gamma_max > reach:
        raise ConfigError(
            f"gamma_max {gamma_max} (--gamma-max, or the space file's) needs a verify of {gamma_max + 1} "
            f"positions priced, and the latency profile {path} measured up to {reach + 1}: pass "
            f"--gamma-max {max(reach, 1)}, or profile again with more positions"
        )


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# The stored settings a resume may change (`MAY_CHANGE`: field -> what it may do); every other one
# typed differently is refused. A change is printed and recorded in run.yaml's provenance
# (`RESUME_CHANGES`: each {setting, from, to, at}, the whole history).
MAY_CHANGE = {"budget": "raised (more trials of the same studies), never lowered"}
RESUME_CHANGES = "resume_changes"


@dataclass(frozen=True)
class Resumed:
    """What a resume continues with: the stored config (its budget raised where typed), the
    compare's stored settings (None for a run), the history of the changes resumes made
    (`changes`, `this` one's last, when it made one)."""

    config: RunConfig
    compare: CompareSettings | None
    changes: tuple[dict, ...]
    this: dict | None = None


def resumed_config(
    out: Path, requested: RunConfig, typed: Mapping[str, str], compare: CompareSettings | None = None
) -> Resumed:
    """The settings a run started with, from its `run.yaml`, to the budget typed, else the stored
    one; for a compare (`compare` is what this command asked for), its stored strategies, seeds and
    random multiple too.

    Only the budget may change on resume (`MAY_CHANGE`), and only up, or one study would mix trials
    scored, measured or constrained in two ways; a lower budget than stored would be ignored by
    the trials already run, so it is refused naming the stored one. `typed` maps the fields
    (dotted: `measure.prompts.n_prompts`, `compare.seeds`) the user set on this command line to
    the option that set them; one that differs from the stored value would be ignored, so it is
    refused, naming the stored value. An untyped setting is the parser's default, not a request,
    so it never replaces a stored value. A directory of the other kind (a compare resumed by
    `run`, or the reverse) is refused.
    """
    stored, provenance, stored_compare = load_run_file(out / RUN_FILE)
    _refuse_other_kind(out, stored_compare is not None, compare is not None)
    old, new = _flat(stored.to_dict()), _flat(requested.to_dict())
    if compare is not None and stored_compare is not None:
        old |= _flat(stored_compare.to_dict(), "compare.")
        new |= _flat(compare.to_dict(), "compare.")
    for field, option in typed.items():
        if field == "budget" or (field == "cost" and new[field] == AUTO_COST):
            continue  # a new budget is the point of a resume; auto means "whatever the run resolved to"
        if new[field] != old[field]:
            stored = f"{field.rsplit('.', 1)[-1]}={_shown(old[field], repr)}"
            raise ConfigError(
                f"{option} {_shown(new[field], str)} would be ignored: the run in {out} continues with its "
                f"stored {stored} ({out / RUN_FILE}); drop {option}, or start a new run in another --out"
            )
    history = tuple(provenance.get(RESUME_CHANGES) or ())
    if "budget" not in typed or requested.budget == stored.budget:
        return Resumed(stored, stored_compare, history)
    option = typed["budget"]
    if requested.budget < stored.budget:
        raise ConfigError(
            f"{option} {requested.budget} is below the stored budget={stored.budget} ({out / RUN_FILE}): on "
            f"resume the budget may be {MAY_CHANGE['budget']}; pass {option} {stored.budget} or more, or "
            f"drop {option}"
        )
    change = {"setting": "budget", "from": stored.budget, "to": requested.budget, "at": _now()}
    return Resumed(stored.with_budget(requested.budget), stored_compare, (*history, change), change)


def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _shown(value: Any, show: Callable[[Any], str]) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else show(value)


def _refuse_other_kind(out: Path, stored_compare: bool, compare: bool) -> None:
    """`run --resume` of a compare directory, or `compare --resume` of a run: one line naming the
    command that continues it (the two would mix studies of two kinds in one journal)."""
    if stored_compare == compare:
        return
    kind, other = ("compare", "run") if stored_compare else ("run", "compare")
    raise ConfigError(
        f"{out} holds a `skipsearch {kind}`, not a {other}: continue it with `skipsearch {kind} --out {out} "
        f"--resume`, or start the {other} in another --out"
    )


def check_searches(
    config: RunConfig, space: SpaceSpec | TierSpec, num_layers: int, strategies: Iterable[str]
) -> dict[str, SearchSetup]:
    """`build_search` for each strategy a run will search with (a compare runs several)."""
    return {s: build_search(replace(config, strategy=s), space, num_layers) for s in strategies}


@dataclass(frozen=True)
class Checked:
    """A config that passed every model-free check, with its cost model resolved; where the depth is
    known without the weights, each strategy's search built at it (`setups`), else None."""

    config: RunConfig
    depth: int | None
    setups: dict[str, SearchSetup] | None


def preflight(config: RunConfig, space: SpaceSpec | TierSpec, strategies: Iterable[str]) -> Checked:
    """Every check of `config` that needs no model, in the order of the module's docstring."""
    check_cache_dir()
    config = resolve_cost(config)
    depth = known_depth(config.measure.model)
    setups = None if depth is None else check_searches(config, space, depth, strategies)
    check_device(config.measure.device)
    return Checked(config, depth, setups)
