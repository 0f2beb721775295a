"""Hand-made acceptance profiles and latency tables whose costs are worked out by hand in the cost tests."""

from __future__ import annotations

import json

import pytest

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.cost.latency import LatencyProfile

exact = pytest.approx


def _profile(*rows: str) -> AcceptanceProfile:
    matches = tuple(tuple(ch == "1" for ch in row) for row in rows)
    return AcceptanceProfile("a:1|m:1", matches, tuple(tuple(1.0 for _ in r) for r in matches), 0.0)


# -- latency profile -----------------------------------------------------------------------------


def _tables(at_k1: float, at_k3: float) -> list[list[float]]:
    """Same times at both context lengths: rows context, columns positions (1, 3)."""
    return [[at_k1, at_k3], [at_k1, at_k3]]


def _latency() -> LatencyProfile:
    """Two layers; embed 1, head 2 -> 4, attn 1 -> 2, mlp 2 -> 3 (positions 1 -> 3); step = 9."""
    tables = {
        "embed": _tables(1, 1),
        "head": _tables(2, 4),
        "attn": [_tables(1, 2), _tables(1, 2)],
        "mlp": [_tables(2, 3), _tables(2, 3)],
    }
    return LatencyProfile.from_dict(
        {
            "meta": {"device": "test", "model": "tiny", "num_layers": 2},
            "context_lengths": [100, 300],
            "positions": [1, 3],
            **tables,
            "spread": {name: json.loads(json.dumps(table)) for name, table in tables.items()},
            "round_overhead": {"1": 0.5, "3": 1.5},
        }
    )


# -- the draft's head with k rows ----------------------------------------------------------------


def _with_head_table(rows: list[int], seconds: list[float]) -> LatencyProfile:
    """`_latency()` (full head 2 at one position) plus a draft-head table."""
    return LatencyProfile.from_dict({**_latency().to_dict(), "head_rows": rows, "head_by_rows": seconds})


# -- drafts at lower precision -------------------------------------------------------------------


def _int8_costs() -> dict:
    """int8 sub-layers of `_latency()`: attn 0.7 -> 1.2, mlp 1.2 -> 1.8 (positions 1 -> 3)."""
    return {
        "attn": [_tables(0.7, 1.2), _tables(0.7, 1.2)],
        "mlp": [_tables(1.2, 1.8), _tables(1.2, 1.8)],
        "step": [6.8, 7.0],
        "weight_bytes": 50.0,
    }


def _with_int8() -> LatencyProfile:
    """`_latency()` plus measured int8 costs (`_int8_costs`)."""
    return LatencyProfile.from_dict({**_latency().to_dict(), "precisions": {"8": _int8_costs()}})
