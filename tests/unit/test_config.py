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
