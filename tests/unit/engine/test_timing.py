"""Round timings bucketed by context length."""

import pytest

from skipsearch.engine import (
    breakdown,
)
from skipsearch.engine.timing import RoundTiming

pytestmark = pytest.mark.usefixtures("one_thread")


# -- timing breakdown -----------------------------------------------------------------------------
def test_breakdown_buckets_by_context_terciles():
    records = [RoundTiming(context, 3, 1, 0.2, 0.5, 0.1, 0.1, 0.1) for context in range(100, 130)]
    buckets = breakdown(records)
    assert [(b.name, b.low, b.high, b.rounds) for b in buckets] == [
        ("short", 100, 109, 10),
        ("medium", 110, 119, 10),
        ("long", 120, 129, 10),
    ]
    shares = {s.phase: s.share for s in buckets[0].phases}
    assert shares["verify"] == pytest.approx(0.5) and sum(shares.values()) == pytest.approx(1.0)
    assert buckets[0].round_p50 == pytest.approx(1.0)
