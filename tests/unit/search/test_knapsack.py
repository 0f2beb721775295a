"""The knapsack frontier equals the brute-force Pareto front."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from skipsearch.search.knapsack import knapsack_frontier


# -- the DP ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_knapsack_frontier_is_the_brute_force_pareto_front(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values, weights = rng.random(8), rng.integers(1, 5, 8).astype(float)
    counts = range(2, 6)
    subsets = [c for k in counts for c in itertools.combinations(range(8), k)]

    def point(items: tuple[int, ...]) -> tuple[float, float]:
        return sum(weights[list(items)]), sum(values[list(items)])

    front = {
        point(s)
        for s in subsets
        if not any(
            point(o)[0] >= point(s)[0] and point(o)[1] < point(s)[1] - 1e-12 for o in subsets if o != s
        )
    }
    frontier = knapsack_frontier(values, weights, counts)
    got = [point(s) for s in frontier]
    assert all(len(s) in counts for s in frontier)
    assert {(round(w, 9), round(v, 9)) for w, v in got} == {(round(w, 9), round(v, 9)) for w, v in front}
    assert [w for w, _ in got] == sorted(w for w, _ in got)
