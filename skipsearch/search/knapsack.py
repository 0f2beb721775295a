"""Knapsack over a draft's units: for every amount of draft cost saved, the least important choice
that saves it (KnapSpec's dynamic programme, docs/theory.md, "Importance, ranking and knapsack").
Pure arithmetic.

Each unit (a layer, or a sub-layer) is a group of options, of which a draft takes at most one (or
exactly one, where the unit has no "as it is" choice): skip it, or run it at int8 or int4. Each
option has a value (importance lost) and a weight (draft cost it saves). The DP tracks the number
of skipped units too, because a space constrains that count (its r_draft band); options that do not
skip (a lower precision) do not count. The 0/1 knapsack of skips alone (`knapsack_frontier`) is the
case of one option per unit. Weights are integers: sub-layer counts are used as they are; measured
seconds or byte shares are rounded to `resolution` steps of the most any choice saves, so two
choices whose savings differ by less than one step (under 0.4% at the default) may be ranked by
value alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

RESOLUTION = 256


@dataclass(frozen=True)
class Option:
    """One way to change a unit: `value` lost, `weight` saved, and whether it counts as a skip."""

    value: float
    weight: float
    skips: bool = True


def integer_weights(
    weights: Sequence[float], resolution: int = RESOLUTION, top: float | None = None
) -> list[int]:
    """Weights as they are when they are already integers, else scaled to `resolution` steps of
    `top` (default: their sum), at least 1 each, so no option is free."""
    if all(float(w).is_integer() and w > 0 for w in weights):
        return [int(w) for w in weights]
    total = math.fsum(weights) if top is None else top
    return [max(1, round(w / total * resolution)) for w in weights]


def choice_frontier(
    groups: Sequence[Sequence[Option]],
    counts: range,
    resolution: int = RESOLUTION,
    required: Sequence[bool] | None = None,
) -> list[tuple[int | None, ...]]:
    """The Pareto-optimal choices, one entry per group: the index of its option taken, or None.
    No other choice whose skip count is in `counts` saves at least as much weight for less value.
    Ordered by weight saved, least first. A group marked `required` takes one of its options.

    `best[k, w]` is the least value of a choice of `k` skips and weight `w`; `taken[g, k, w]` is
    the option (1-based, 0: none) group `g` takes in it, so each frontier choice is read back group
    by group.
    """
    required = required or [False] * len(groups)
    flat = [option.weight for group in groups for option in group]
    top = math.fsum(max((o.weight for o in group), default=0.0) for group in groups)
    steps_flat = iter(integer_weights(flat, resolution, top))
    steps = [[next(steps_flat) for _ in group] for group in groups]
    skippable = sum(any(o.skips for o in group) for group in groups)
    top_count = min(counts.stop - 1, skippable)
    top_weight = sum(max(s, default=0) for s in steps)
    best = np.full((top_count + 1, top_weight + 1), np.inf)
    best[0, 0] = 0.0
    taken = np.zeros((len(groups), top_count + 1, top_weight + 1), dtype=np.int16)
    for g, (group, group_steps) in enumerate(zip(groups, steps, strict=True)):
        chosen = np.full_like(best, np.inf) if required[g] else best.copy()
        for index, (option, step) in enumerate(zip(group, group_steps, strict=True), start=1):
            shifted = np.full_like(best, np.inf)
            skip = int(option.skips)
            shifted[skip:, step:] = best[: top_count + 1 - skip, : top_weight + 1 - step] + option.value
            better = shifted < chosen
            taken[g][better] = index
            chosen = np.where(better, shifted, chosen)
        best = chosen
    allowed = [k for k in counts if k <= top_count]
    points = sorted(
        ((w, best[k, w], k) for k in allowed for w in range(top_weight + 1) if np.isfinite(best[k, w])),
        key=lambda p: (-p[0], p[1]),
    )
    frontier, least = [], np.inf
    for weight, value, count in points:  # heaviest first: keep a choice only if it loses less
        if value < least:
            least = value
            frontier.append(_read_back(taken, groups, steps, count, weight))
    return frontier[::-1]


def knapsack_frontier(
    values: Sequence[float], weights: Sequence[float], counts: range, resolution: int = RESOLUTION
) -> list[tuple[int, ...]]:
    """The Pareto-optimal skip sets (indices into `values`): `choice_frontier` with one option, a
    skip of value `values[i]` and weight `weights[i]`, per unit."""
    groups = [[Option(value, weight)] for value, weight in zip(values, weights, strict=True)]
    return [
        tuple(i for i, taken in enumerate(choice) if taken is not None)
        for choice in choice_frontier(groups, counts, resolution)
    ]


def _read_back(
    taken: np.ndarray,
    groups: Sequence[Sequence[Option]],
    steps: Sequence[Sequence[int]],
    count: int,
    weight: int,
) -> tuple[int | None, ...]:
    choice: list[int | None] = [None] * len(groups)
    for g in range(len(groups) - 1, -1, -1):
        index = int(taken[g, count, weight])
        if index:
            choice[g] = index - 1
            count -= int(groups[g][index - 1].skips)
            weight -= steps[g][index - 1]
    return tuple(choice)
