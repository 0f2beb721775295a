"""`bench.graphed`: a round priced from the times of graphed passes."""

from __future__ import annotations

import pytest

from skipsearch.bench.graphed import graphed_round


def test_a_graphed_round_prices_the_draft_per_step_and_adds_the_overhead() -> None:
    times = {"full": 2.0, "draft 0": 3.0, "verify 0 1": 2.2, "verify 0 3": 2.6, "draft 1": 9.0}
    form = graphed_round(times, 0, (1, 3), overhead=lambda g: 0.2)
    assert form.draft_step == 1.0  # `draft i` times max(gammas) = 3 steps
    assert form.round_cost(3) == pytest.approx((3.0 + 2.6 + 0.2) / 2.0)
    assert graphed_round(times, 0, (1, 3)).round_cost(1) == pytest.approx((1.0 + 2.2) / 2.0)
