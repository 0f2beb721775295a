"""`validate.stats`: relative errors of predictions, in percent."""

import pytest

from skipsearch.validate.stats import ErrorStats


def test_error_stats_in_percent() -> None:
    stats = ErrorStats.of([1.02, 0.9], [1.0, 1.0])
    assert (stats.n, stats.within_3) == (2, 1)
    assert stats.mean_abs == pytest.approx(6.0)
    assert stats.max_abs == pytest.approx(10.0)
    assert stats.bias == pytest.approx(-4.0)
    assert stats.row("x") == ["x", "2", "6.0%", "10.0%", "-4.0%", "1/2"]
