"""What a LatencyProfile holds and must hold (`cost.latency`; docs/theory.md, "Calibrated cost"):
the tables of one lower precision (`PrecisionCosts`), and the checks every profile passes when it
is built or read (`check_profile`: increasing axes from 1, each table's shape, finite seconds), so
a damaged or hand-edited profile file fails with the field to fix and how to remake it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from skipsearch.errors import ConfigError
from skipsearch.masks import LOW_BITS

if TYPE_CHECKING:
    from skipsearch.cost.latency import LatencyProfile


@dataclass(frozen=True)
class PrecisionCosts:
    """What the profiler measures of a draft whose weights are read at one lower precision (int8 or
    int4, docs/theory.md "Calibrated cost"): what `LatencyProfile.with_precision` stores.

    `attn[layer][c][k]` and `mlp[layer][c][k]` are median seconds of each sub-layer with its weights
    at that precision, by the LatencyProfile's `context_lengths` and by `positions` (the rows of the
    pass: 1 for a chain's draft step, more for a token tree's draft passes), as its full-precision
    `attn` / `mlp`; an empty `positions` is the LatencyProfile's own (the form before the profiler
    timed fewer position counts at lower precision than at full). `step[c]` is a whole one-position
    decode step with every layer at that precision (embedding and head as the model's own), and
    `weight_bytes` the bytes of weights that step reads: with the K/V of the context and the copy
    bandwidth they give the step's memory floor and the bandwidth it reached
    (`LatencyProfile.precision_floor`). `step` and `weight_bytes` are optional (a report then shows
    no floor); the two tables are not.
    """

    attn: tuple[tuple[tuple[float, ...], ...], ...]
    mlp: tuple[tuple[tuple[float, ...], ...], ...]
    step: tuple[float, ...] = ()
    weight_bytes: float | None = None
    positions: tuple[int, ...] = ()

    def timed_positions(self, profile_positions: tuple[int, ...]) -> tuple[int, ...]:
        """The position counts these tables were timed at: their own, else the profile's."""
        return self.positions or profile_positions

    def to_dict(self) -> dict[str, Any]:
        return {
            "attn": np.asarray(self.attn).tolist(),
            "mlp": np.asarray(self.mlp).tolist(),
            "step": list(self.step),
            "weight_bytes": self.weight_bytes,
            "positions": list(self.positions),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PrecisionCosts:
        weight_bytes = data.get("weight_bytes")
        return cls(
            attn=tuples(data["attn"]),
            mlp=tuples(data["mlp"]),
            step=tuple(float(t) for t in data.get("step", ())),
            weight_bytes=None if weight_bytes is None else float(weight_bytes),
            positions=tuple(int(k) for k in data.get("positions", ())),
        )


def check_profile(profile: LatencyProfile) -> None:
    """Every table of `profile` has its shape and holds finite seconds, its axes increase from 1: run
    when a profile is built, so a damaged or hand-edited file fails naming the field to fix."""
    for name in ("context_lengths", "positions"):
        axis = getattr(profile, name)
        if not axis or any(b <= a for a, b in itertools.pairwise(axis)) or axis[0] < 1:
            raise ConfigError(f"{name} must be a non-empty increasing list of integers >= 1, got {axis}")
    if not profile.attn or len(profile.mlp) != len(profile.attn):
        raise ConfigError(
            f"attn and mlp must cover the same layers, got {len(profile.attn)} and {len(profile.mlp)}"
        )
    if profile.meta.get("num_layers", profile.num_layers) != profile.num_layers:
        raise ConfigError(
            f"meta.num_layers is {profile.meta['num_layers']} but the tables cover {profile.num_layers}"
        )
    for table in profile.TABLES:
        _check_table(profile, table, getattr(profile, table))
        _check_table(profile, f"spread.{table}", profile.spread.get(table))
    if not profile.round_overhead or min(profile.round_overhead) < 1:
        raise ConfigError(f"round_overhead needs entries for gamma >= 1, got {dict(profile.round_overhead)}")
    if any(not (math.isfinite(s) and s >= 0.0) for s in profile.round_overhead.values()):
        raise ConfigError("round_overhead seconds must be finite and >= 0")
    _check_head_rows(profile)
    if profile.pillar_choice and (
        len(profile.pillar_choice) != len(profile.context_lengths)
        or any(not (math.isfinite(t) and t >= 0.0) for t in profile.pillar_choice)
    ):
        raise ConfigError(
            "pillar_choice needs one finite time >= 0 per context length; re-run `skipsearch profile`"
        )
    for bits, costs in profile.precisions.items():
        _check_precision(profile, bits, costs)


def _check_precision(profile: LatencyProfile, bits: int, costs: PrecisionCosts) -> None:
    if bits not in LOW_BITS:
        raise ConfigError(
            f"precision costs are for {bits} bits: a draft reads its weights at one of "
            f"{', '.join(map(str, LOW_BITS))}; re-run `skipsearch profile`"
        )
    positions = costs.timed_positions(profile.positions)
    if any(b <= a for a, b in itertools.pairwise(positions)) or positions[0] < 1:
        raise ConfigError(
            f"precisions.{bits}.positions must be an increasing list of integers >= 1, got "
            f"{list(positions)}; re-run `skipsearch profile`"
        )
    _check_table(profile, f"precisions.{bits}.attn", costs.attn, len(positions))
    _check_table(profile, f"precisions.{bits}.mlp", costs.mlp, len(positions))
    if costs.step and (
        len(costs.step) != len(profile.context_lengths)
        or any(not (math.isfinite(t) and t > 0.0) for t in costs.step)
    ):
        raise ConfigError(
            f"precisions.{bits}.step needs one finite time > 0 per context length; "
            "re-run `skipsearch profile`"
        )
    if costs.weight_bytes is not None and not (math.isfinite(costs.weight_bytes) and costs.weight_bytes > 0):
        raise ConfigError(
            f"precisions.{bits}.weight_bytes must be a byte count > 0, got {costs.weight_bytes}"
        )


def _check_head_rows(profile: LatencyProfile) -> None:
    rows, times = profile.head_rows, profile.head_by_rows
    if (
        len(rows) != len(times)
        or any(b <= a for a, b in itertools.pairwise(rows))
        or min(rows, default=1) < 1
    ):
        raise ConfigError(
            f"head_rows must be increasing row counts >= 1, one per head_by_rows entry, got {list(rows)} "
            f"and {len(times)} times; re-run `skipsearch profile`"
        )
    if any(not (math.isfinite(t) and t > 0.0) for t in times):
        raise ConfigError("head_by_rows seconds must be finite and > 0; re-run `skipsearch profile`")
    recorded = profile.meta.get("vocab_size")
    if rows and recorded is not None and rows[-1] != recorded:
        raise ConfigError(f"head_rows must end at the vocabulary size {recorded}, got {rows[-1]}")


def _check_table(profile: LatencyProfile, name: str, table: Any, positions: int | None = None) -> None:
    layers = () if name.endswith(("embed", "head")) else (profile.num_layers,)
    shape = (*layers, len(profile.context_lengths), positions or len(profile.positions))
    try:
        values = np.asarray(table, dtype=float)
    except (TypeError, ValueError):
        values = np.empty(0)
    if values.shape != shape or not np.all(np.isfinite(values)) or np.any(values < 0):
        raise ConfigError(
            f"latency table {name} must hold finite seconds >= 0 with shape {list(shape)} "
            "(layers x context lengths x positions); re-run `skipsearch profile`"
        )


def tuples(nested: Any) -> Any:
    """Nested lists of numbers as nested tuples of floats (immutable, comparable)."""
    if isinstance(nested, list | tuple):
        return tuple(tuples(item) for item in nested)
    return float(nested)
