"""Batch gain and throughput ratio from the memory budget."""

from __future__ import annotations

import pytest

from skipsearch.cost.memory import MemoryBudget, throughput_ratio
from skipsearch.errors import ConfigError
from tests.unit.cost.conftest import exact

# -- serving memory ------------------------------------------------------------------------------


def test_memory_batch_gain_and_throughput_ratio() -> None:
    memory = MemoryBudget(total=80, big_weights=37.5, draft_weights=3.75, kv_per_sequence=1)
    assert (memory.batch_sd, memory.batch_ssd) == (38, 42)
    assert memory.beta == exact(42 / 38)
    assert throughput_ratio(memory, speedup_ssd=1.5, speedup_sd=1.8) == exact(42 / 38 * 1.5 / 1.8)


def test_memory_without_room_for_kv_is_an_error() -> None:
    with pytest.raises(ConfigError, match="less than one sequence's KV cache"):
        _ = MemoryBudget(total=40, big_weights=37.5, draft_weights=3.75, kv_per_sequence=1).batch_sd
    with pytest.raises(ConfigError, match="kv_per_sequence"):
        MemoryBudget(total=80, big_weights=37.5, draft_weights=0, kv_per_sequence=0)
