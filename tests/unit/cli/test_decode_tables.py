"""The caveats printed under `skipsearch decode` timing tables."""

from __future__ import annotations

import pytest

from skipsearch.bench.decode import timing_caveats

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_decode_warns_on_few_repeats_and_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skipsearch.cpu.threads.busy_cores", lambda: 0.1)
    assert timing_caveats(3) == []
    assert "only 1 repeat" in timing_caveats(1)[0]
    monkeypatch.setattr("skipsearch.cpu.threads.busy_cores", lambda: 1.0)
    assert "other processes keep 1.0 of the" in timing_caveats(3)[0]
