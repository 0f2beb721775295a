"""`--cost auto`: which cost model a run scores with, decided once; a resume keeps the stored settings."""

from pathlib import Path

import pytest

from skipsearch.config import RunConfig
from skipsearch.run import pipeline
from skipsearch.run.pipeline import RunContext, cost_note, resolve_cost
from skipsearch.store import RUN_FILE

PROFILE = "/cache/profiles/smollm2-135m-cpu.json"


def context(profiled: bool) -> RunContext:
    """Only `latency` and the provenance matter here: the model is never touched."""
    return RunContext(
        measurement=None,
        latency=object() if profiled else None,
        provenance={"latency_profile": PROFILE if profiled else None},
    )


@pytest.mark.parametrize(("profiled", "expected"), [(True, "calibrated"), (False, "closed-form")])
def test_auto_is_calibrated_exactly_when_a_profile_exists(profiled: bool, expected: str) -> None:
    resolved = resolve_cost(RunConfig(cost="auto"), context(profiled))
    assert resolved.cost == expected
    assert resolved.budget == RunConfig().budget  # nothing else changes


def test_an_explicit_cost_is_kept() -> None:
    assert resolve_cost(RunConfig(cost="closed-form"), context(True)).cost == "closed-form"


def test_a_resumed_comparison_keeps_its_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Started in closed form for acceptance: a resume with other flags continues exactly that,
    to the new budget (the model is never loaded: the test stops where it would be)."""
    RunConfig(cost="closed-form", objective="acceptance", budget=5).save(tmp_path / RUN_FILE, {})
    opened: list[RunConfig] = []

    def stop(config: RunConfig, strategies: object = None) -> RunContext:
        opened.append(config)
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "open_context", stop)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_compare(RunConfig(cost="auto", budget=9), 1, tmp_path, resume=True, progress=print)
    assert (opened[0].cost, opened[0].objective, opened[0].budget) == ("closed-form", "acceptance", 9)


def test_the_note_names_the_profile_or_how_to_make_one() -> None:
    calibrated = cost_note(RunConfig(cost="calibrated"), context(True))
    assert "calibrated" in calibrated and PROFILE in calibrated
    closed = cost_note(RunConfig(cost="closed-form"), context(False))
    assert "closed form" in closed and "skipsearch profile --model smollm2-135m" in closed
    assert "skipsearch profile" not in cost_note(RunConfig(cost="closed-form"), context(True))
