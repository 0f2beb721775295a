"""0/1 knapsack over skippable units: for every amount of draft cost saved, the least important
set of units that saves it (KnapSpec's dynamic programme, docs/theory.md, "Importance, ranking and
knapsack"). Pure arithmetic.

Items are the units a space may skip, each with a value (importance lost by skipping it) and a
weight (draft cost it saves). The DP tracks the number of skipped units too, because a space
constrains that count (its r_draft band). Weights are integers: sub-layer counts are used as they
are; measured seconds are rounded to `resolution` steps of the total, so two sets whose savings
differ by less than one step (under 0.4% at the default) may be ranked by value alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

RESOLUTION = 256


def integer_weights(weights: Sequence[float], resolution: int = RESOLUTION) -> list[int]:
    """Weights as they are when they are already integers, else scaled to `resolution` steps of
    their sum (at least 1 each, so no unit is free)."""
    if all(float(w).is_integer() and w > 0 for w in weights):
        return [int(w) for w in weights]
    total = math.fsum(weights)
    return [max(1, round(w / total * resolution)) for w in weights]


def knapsack_frontier(
    values: Sequence[float], weights: Sequence[float], counts: range, resolution: int = RESOLUTION
) -> list[tuple[int, ...]]:
    """The Pareto-optimal skip sets (indices into `values`): no other set with a count in
    `counts` saves at least as much weight for less value. Ordered by weight saved, least first.

    `best[k, w]` is the least value of a set of exactly `k` items and weight `w`; `take[i, k, w]`
    records whether item `i` is in it, so each frontier set is read back item by item.
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    steps = integer_weights(weights, resolution)
    top_count, top_weight = min(counts.stop - 1, len(values)), sum(steps)
    best = np.full((top_count + 1, top_weight + 1), np.inf)
    best[0, 0] = 0.0
    take = np.zeros((len(values), top_count + 1, top_weight + 1), dtype=bool)
    for item, (value, step) in enumerate(zip(values, steps, strict=True)):
        with_item = np.full_like(best, np.inf)
        with_item[1:, step:] = best[:-1, : top_weight + 1 - step] + value
        take[item] = with_item < best
        best = np.where(take[item], with_item, best)
    allowed = [k for k in counts if k <= top_count]
    points = sorted(
        ((w, best[k, w], k) for k in allowed for w in range(top_weight + 1) if np.isfinite(best[k, w])),
        key=lambda p: (-p[0], p[1]),
    )
    frontier, least = [], np.inf
    for (
        weight,
        value,
        count,
    ) in points:  # heaviest first: keep a set only if it loses less than all heavier ones
        if value < least:
            least = value
            frontier.append(_read_back(take, steps, count, weight))
    return frontier[::-1]


def _read_back(take: np.ndarray, steps: Sequence[int], count: int, weight: int) -> tuple[int, ...]:
    chosen = []
    for item in range(len(steps) - 1, -1, -1):
        if take[item, count, weight]:
            chosen.append(item)
            count, weight = count - 1, weight - steps[item]
    return tuple(sorted(chosen))
