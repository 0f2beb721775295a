"""Checks a run makes before loading anything: the cost model chosen and informed strategies' inputs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from skipsearch.config import RunConfig
from skipsearch.errors import ConfigError
from skipsearch.models.loading import dtype_name
from skipsearch.run.preflight import resolve_cost
from skipsearch.store import default_profile_path
from tests.unit.conftest import synthetic_latency
from tests.unit.search.conftest import (
    NUM_LAYERS,
)


def write_profile(device: str = "cpu", graphs: bool = False) -> None:
    """The file's existence decides `auto` (the model is never touched); its positions (1..3)
    bound the draft lengths it can price."""
    path = default_profile_path("smollm2-135m", device, dtype_name(device, "auto"), graphs)
    path.parent.mkdir(parents=True, exist_ok=True)
    synthetic_latency().save(path)


def test_the_run_checks_informed_strategies_before_the_reference_is_built() -> None:
    """`check_searches` runs before the model loads (known depth) or right after, before any file."""
    from skipsearch.config import RunConfig
    from skipsearch.run.preflight import check_searches
    from skipsearch.search.space_files import load_space

    with pytest.raises(ConfigError, match="use --strategy exhaustive"):
        check_searches(RunConfig(strategy="knapsack"), load_space("contiguous"), NUM_LAYERS, ["knapsack"])
    measured = RunConfig(strategy="ranking", importance="measured", budget=10)
    with pytest.raises(ConfigError, match=r"evaluates 10 single-unit masks .* raise --budget above 10"):
        check_searches(measured, load_space("sparse"), NUM_LAYERS, ["ranking"])
    check_searches(measured, load_space("sparse"), NUM_LAYERS, ["random"])  # only informed ones measure
    check_searches(replace(measured, budget=11), load_space("sparse"), NUM_LAYERS, ["ranking"])


@pytest.mark.parametrize(("profiled", "expected"), [(True, "calibrated"), (False, "closed-form")])
def test_auto_is_calibrated_exactly_when_a_profile_exists(
    cache_in_tmp: Path, profiled: bool, expected: str
) -> None:
    if profiled:
        write_profile()
    resolved = resolve_cost(RunConfig(cost="auto"))
    assert resolved.cost == expected
    assert resolved.budget == RunConfig().budget  # nothing else changes


def test_an_explicit_cost_is_kept(cache_in_tmp: Path) -> None:
    write_profile()
    assert resolve_cost(RunConfig(cost="closed-form")).cost == "closed-form"


def test_calibrated_without_a_profile_is_refused_naming_the_command(cache_in_tmp: Path) -> None:
    with pytest.raises(ConfigError, match="skipsearch profile --model smollm2-135m --device cpu"):
        resolve_cost(RunConfig(cost="calibrated"))


def test_graphs_score_with_the_graphed_profile_and_need_it(cache_in_tmp: Path) -> None:
    """The eager profile does not stand in for the graphed one: `--graphs` without it is refused."""
    write_profile()  # the eager one only
    graphed = RunConfig(cost="auto", graphs=True, measure=replace(RunConfig().measure, device="cuda"))
    with pytest.raises(ConfigError, match="skipsearch profile --model smollm2-135m --device cuda --graphs"):
        resolve_cost(graphed)
    write_profile("cuda", graphs=True)
    assert resolve_cost(graphed).cost == "calibrated"
    assert RunConfig.from_dict(graphed.to_dict()) == graphed


def test_a_calibrated_run_scores_only_the_draft_lengths_its_profile_prices(cache_in_tmp: Path) -> None:
    """A verify of γ + 1 positions is priced from the profile's measured positions (1..3 here)."""
    write_profile()
    assert resolve_cost(RunConfig(cost="auto", gamma_max=2)).cost == "calibrated"
    with pytest.raises(
        ConfigError, match=r"gamma_max 3 .* needs a verify of 4 positions .*: pass --gamma-max 2,"
    ):
        resolve_cost(RunConfig(cost="auto", gamma_max=3))
    assert resolve_cost(RunConfig(cost="closed-form", gamma_max=8)).gamma_max == 8  # no profile read


def test_graphs_off_a_gpu_are_refused() -> None:
    with pytest.raises(ConfigError, match="CUDA graphs need a GPU, and --device is cpu"):
        RunConfig(graphs=True)


def _stored(tmp_path: Path, budget: int, provenance: dict | None = None) -> Path:
    RunConfig(budget=budget, strategy="random").save(tmp_path / "run.yaml", provenance or {})
    return tmp_path


def test_a_resume_may_raise_the_budget_and_keeps_the_history(tmp_path: Path) -> None:
    from skipsearch.run.preflight import RESUME_CHANGES, resumed_config

    earlier = {"setting": "budget", "from": 2, "to": 3, "at": "2026-12-01T00:00:00+00:00"}
    out = _stored(tmp_path, 3, {RESUME_CHANGES: [earlier]})
    resumed = resumed_config(out, RunConfig(budget=5), {"budget": "--budget"})
    assert resumed.config.budget == 5 and resumed.config.strategy == "random"
    assert resumed.this is not None and (resumed.this["from"], resumed.this["to"]) == (3, 5)
    assert resumed.changes == (earlier, resumed.this)
    same = resumed_config(out, RunConfig(budget=3), {"budget": "--budget"})
    untyped = resumed_config(out, RunConfig(budget=99), {})
    assert same.this is None and untyped.this is None and untyped.config.budget == 3


def test_a_resume_refuses_a_lower_budget_naming_the_stored_one(tmp_path: Path) -> None:
    from skipsearch.run.preflight import resumed_config

    out = _stored(tmp_path, 200)
    with pytest.raises(
        ConfigError, match=r"--budget 10 is below the stored budget=200 .*pass --budget 200 or more"
    ):
        resumed_config(out, RunConfig(budget=10), {"budget": "--budget"})
