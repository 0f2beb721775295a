"""Relative errors of a prediction over a set of masks: how far, how biased, how often within 3%."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorStats:
    """Relative errors `(predicted - measured) / measured` over a set of points, in percent."""

    n: int
    mean_abs: float
    max_abs: float
    bias: float
    within_3: int

    @classmethod
    def of(cls, predicted: Sequence[float], measured: Sequence[float]) -> ErrorStats:
        errors = [100.0 * (p - m) / m for p, m in zip(predicted, measured, strict=True)]
        absolute = [abs(e) for e in errors]
        return cls(
            len(errors),
            statistics.fmean(absolute),
            max(absolute),
            statistics.fmean(errors),
            sum(a <= 3.0 for a in absolute),
        )

    def row(self, label: str) -> list[str]:
        return [
            label,
            str(self.n),
            f"{self.mean_abs:.1f}%",
            f"{self.max_abs:.1f}%",
            f"{self.bias:+.1f}%",
            f"{self.within_3}/{self.n}",
        ]

    HEADER = ("prediction", "masks", "mean abs err", "max abs err", "bias", "within 3%")
