"""A run's settings survive run.yaml: the draft choices included, and files from before them."""

from __future__ import annotations

from skipsearch.config import RunConfig
from skipsearch.masks import KVPattern


def test_a_runs_kv_patterns_round_trip_and_old_files_have_none() -> None:
    config = RunConfig(draft_vocab=(None, 8192), kv=(None, KVPattern(4, 1024)), context=8192)
    data = config.to_dict()
    assert data["kv"] == ["full", "s4w1024"] and data["draft_vocab"] == ["full", 8192]
    assert RunConfig.from_dict(data) == config
    old = {key: value for key, value in data.items() if key != "kv"}
    assert RunConfig.from_dict(old).kv is None


def test_a_runs_tree_shapes_round_trip_and_a_bad_one_is_one_error() -> None:
    import pytest

    from skipsearch.errors import ConfigError

    config = RunConfig(trees=("2x1", "2x2x1"))
    data = config.to_dict()
    assert data["trees"] == ["2x1", "2x2x1"] and RunConfig.from_dict(data) == config
    old = {key: value for key, value in data.items() if key != "trees"}
    assert RunConfig.from_dict(old).trees is None  # a run from before trees: the space decides
    with pytest.raises(ConfigError, match="bad tree shape"):
        RunConfig(trees=("2x",))


def test_the_api_refuses_what_the_command_line_refuses() -> None:
    """`skipsearch.search` builds these dataclasses: their checks are the command line's bounds."""
    import pytest

    from skipsearch.acceptance.measure_config import MeasureConfig
    from skipsearch.config import CompareSettings
    from skipsearch.errors import ConfigError

    for settings, message in (
        ({"gamma_max": 10**9}, "--gamma-max 1000000000 is above 32"),
        ({"temperature": float("nan")}, "--temperature nan is not a finite number"),
        ({"seed": -1}, "--seed -1 is below 0: pass --seed 0 or more"),
        ({"seed": 2**32}, "pass --seed 4294967295 or less"),
        ({"budget": 1.5}, "--budget 1.5 is not an integer"),
        ({"gamma_min": 5, "gamma_max": 4}, "gamma_min=5, is above --gamma-max 4"),
    ):
        with pytest.raises(ConfigError, match=message):
            RunConfig(**settings)
    with pytest.raises(ConfigError, match="--dtype 'int8' is not a dtype a model runs in"):
        MeasureConfig(dtype="int8")
    with pytest.raises(ConfigError, match="--random-multiple 1 is the budget"):
        CompareSettings(("random",), random_multiple=1)
