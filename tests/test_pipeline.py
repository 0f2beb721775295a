"""`--cost auto`: which cost model a run scores with, decided once and kept on resume."""

from pathlib import Path

import pytest

from skipsearch.config import RunConfig
from skipsearch.pipeline import RUN_FILE, RunContext, cost_note, resolve_cost

PROFILE = "/cache/profiles/smollm2-135m-cpu.json"


def context(profiled: bool) -> RunContext:
    """Only `latency` and the provenance matter here: the model is never touched."""
    return RunContext(
        measurement=None,
        latency=object() if profiled else None,
        provenance={"latency_profile": PROFILE if profiled else None},
    )


@pytest.mark.parametrize(("profiled", "expected"), [(True, "calibrated"), (False, "closed-form")])
def test_auto_is_calibrated_exactly_when_a_profile_exists(
    tmp_path: Path, profiled: bool, expected: str
) -> None:
    resolved = resolve_cost(RunConfig(cost="auto"), context(profiled), tmp_path)
    assert resolved.cost == expected
    assert resolved.budget == RunConfig().budget  # nothing else changes


def test_an_explicit_cost_is_kept(tmp_path: Path) -> None:
    assert resolve_cost(RunConfig(cost="closed-form"), context(True), tmp_path).cost == "closed-form"


def test_a_resumed_run_keeps_the_cost_it_started_with(tmp_path: Path) -> None:
    """Profiled after the run started: the resumed study still scores in closed form."""
    RunConfig(cost="closed-form").save(tmp_path / RUN_FILE, {})
    assert resolve_cost(RunConfig(cost="auto"), context(True), tmp_path).cost == "closed-form"


def test_the_note_names_the_profile_or_how_to_make_one() -> None:
    calibrated = cost_note(RunConfig(cost="calibrated"), context(True))
    assert "calibrated" in calibrated and PROFILE in calibrated
    closed = cost_note(RunConfig(cost="closed-form"), context(False))
    assert "closed form" in closed and "skipsearch profile --model smollm2-135m" in closed
    assert "skipsearch profile" not in cost_note(RunConfig(cost="closed-form"), context(True))
