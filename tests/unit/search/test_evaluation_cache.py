"""The evaluation cache: round trip, a torn line and its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.search import (
    EvaluationCache,
)
from tests.unit.search.conftest import NUM_LAYERS, synthetic_profile


def test_cache_round_trip_torn_line_and_key(tmp_path: Path) -> None:
    mask = SkipMask.from_layers(NUM_LAYERS, [3, 4])
    cache = EvaluationCache(tmp_path, key="model-a")
    cache.put(mask, synthetic_profile(mask), 1.5)
    with cache.path.open("a") as f:
        f.write('{"mask": "a:5|m:5", "prof')  # killed mid-write
    reopened = EvaluationCache(tmp_path, key="model-a")
    assert len(reopened) == 1 and reopened.get(mask) is not None
    other = SkipMask.from_layers(NUM_LAYERS, [6])
    reopened.put(other, synthetic_profile(other), 0.5)
    assert other in EvaluationCache(tmp_path)
    cached = reopened.get(mask)
    assert cached is not None and cached.profile.greedy_match == synthetic_profile(mask).greedy_match
    with pytest.raises(ConfigError, match="model-a"):
        EvaluationCache(tmp_path, key="model-b")
