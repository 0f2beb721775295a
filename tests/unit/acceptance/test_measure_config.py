"""What one measurement is: checked on construction, and read back from what run.yaml holds."""

from __future__ import annotations

import pytest

from skipsearch.acceptance.measure_config import MeasureConfig
from skipsearch.errors import ConfigError
from skipsearch.masks import KVPattern


def test_kv_patterns_round_trip_and_old_files_read_as_every_key() -> None:
    config = MeasureConfig(draft_vocabs=(8192,), kv_patterns=(KVPattern(4, 1024), KVPattern(0, 512)))
    data = config.to_dict()
    assert data["kv_patterns"] == ["s4w1024", "s0w512"]
    assert MeasureConfig.from_dict(data) == config
    old = {key: value for key, value in data.items() if key != "kv_patterns"}
    assert MeasureConfig.from_dict(old).kv_patterns == ()


def test_a_pattern_named_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="name one twice"):
        MeasureConfig(kv_patterns=(KVPattern(4, 64), KVPattern(4, 64)))


def test_pillars_in_self_mode_are_refused_and_their_pattern_reads_back() -> None:
    with pytest.raises(ConfigError, match="--mode rounds"):
        MeasureConfig(mode="self", kv_patterns=(KVPattern(4, 64, 16),))
    config = MeasureConfig(mode="rounds", kv_patterns=(KVPattern(4, 64, 16),))
    assert config.to_dict()["kv_patterns"] == ["s4w64k16"]
    assert MeasureConfig.from_dict(config.to_dict()) == config
