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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.models.device import check_device
from skipsearch.models.loading import dtype_name
from skipsearch.models.registry import REGISTRY
from skipsearch.search.objective import AUTO_COST
from skipsearch.search.space_files import load_space
from skipsearch.search.space_spec import TierSpace
from skipsearch.search.spaces import ConcreteSpace
from skipsearch.search.strategies import (
    INFORMED,
    PlanContext,
    Strategy,
    informed_space,
    make_strategy,
    measured_units_budget,
)
from skipsearch.store import RUN_FILE, readable_profile_path


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


def build_search(config: RunConfig, num_layers: int) -> SearchSetup:
    """The space and strategy of `config` at `num_layers`, with everything that can refuse them
    checked now: infeasible constraints, sampler packages, CMA-ES with --pareto, an exhaustive
    plan beyond the budget, an informed strategy on a space it cannot rank or a measured
    importance that would spend the whole budget."""
    resolved = load_space(config.space).resolve(num_layers)
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
    if config.cost != AUTO_COST:
        return config
    return replace(config, cost="calibrated" if profiled else "closed-form")


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def resumed_config(out: Path, requested: RunConfig, typed: Mapping[str, str]) -> RunConfig:
    """The settings a run started with, from its `run.yaml`, to the budget typed, else the stored one.

    Only the budget may change on resume, or one study would mix trials scored, measured or
    constrained in two ways. `typed` maps the `RunConfig` fields (dotted: `measure.prompts.
    n_prompts`) the user set on this command line to the option that set them; one that differs
    from the stored value would be ignored, so it is refused, naming the stored value. An untyped
    setting is the parser's default, not a request, so it never replaces a stored value.
    """
    stored = RunConfig.load(out / RUN_FILE)[0]
    old, new = _flat(stored.to_dict()), _flat(requested.to_dict())
    for field, option in typed.items():
        if field == "budget" or (field == "cost" and new[field] == AUTO_COST):
            continue  # a new budget is the point of a resume; auto means "whatever the run resolved to"
        if new[field] != old[field]:
            raise ConfigError(
                f"{option} {new[field]} would be ignored: the run in {out} continues with its stored "
                f"{field.rsplit('.', 1)[-1]}={old[field]!r} ({out / RUN_FILE}); drop {option}, or start a "
                "new run in another --out"
            )
    return stored.with_budget(requested.budget) if "budget" in typed else stored


def check_searches(config: RunConfig, num_layers: int, strategies: Iterable[str]) -> None:
    """`build_search` for each strategy a run will search with (a compare runs several)."""
    for strategy in strategies:
        build_search(replace(config, strategy=strategy), num_layers)


def preflight(config: RunConfig, strategies: Iterable[str]) -> RunConfig:
    """Every check of `config` that needs no model; returns it with the cost model resolved."""
    config = resolve_cost(config)
    depth = known_depth(config.measure.model)
    if depth is not None:
        check_searches(config, depth, strategies)
    check_device(config.measure.device)
    return config
