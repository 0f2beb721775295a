"""What the search maximises: a `Scorer` turns a mask's AcceptanceProfile into a `Score`.

The scorer is injected (docs/architecture.md, "Data flow": everything after the AcceptanceProfile is
cheap arithmetic in the driver), so the cost model can change without touching the search or
re-running the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from skipsearch.acceptance.profile import AcceptanceProfile
from skipsearch.masks import SkipMask


@dataclass(frozen=True)
class Score:
    """One mask's objective: `value` (maximised, e.g. best speedup) at `gamma_best`.

    `per_gamma` holds the value at every draft length tried; `details` holds anything else worth
    a column in the trials table (JSON-serialisable: it is stored as Optuna user attrs).
    """

    value: float
    gamma_best: int
    per_gamma: Mapping[int, float]
    details: Mapping[str, Any] = field(default_factory=dict)


Scorer = Callable[[SkipMask, AcceptanceProfile], Score]
