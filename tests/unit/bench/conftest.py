"""A tiny runner and its measured latency profile, shared by the profiler tests and the `profile` command's
tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch import cli
from skipsearch.cost.latency import LatencyProfile
from skipsearch.cost.profiler import (
    measure_latency,
)
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

CONTEXTS = (8, 24)

POSITIONS = (1, 2, 3, 4)


@pytest.fixture(scope="module")
def runner() -> LayerwiseRunner:
    return LayerwiseRunner(tiny_model("llama", layers=4))


@pytest.fixture(scope="module")
def measured(runner: LayerwiseRunner) -> LatencyProfile:
    return measure_latency(runner, CONTEXTS, POSITIONS, repeats=3, warmup=1, model="tiny")


@pytest.fixture
def only_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register only this command, so the test does not depend on the other commands' imports."""
    monkeypatch.setattr(cli, "COMMANDS", ("profile",))


@pytest.fixture
def cache_in_tmp(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Default profile paths inside the test's folder (not for the real model: it would re-convert)."""
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"
