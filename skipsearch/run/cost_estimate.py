"""What a search costs, measured while it runs: the seconds the model and its reference states took,
the seconds a trial takes (timed on the first trials and refined as they come), the process's peak
memory, and the total the budget will take, finalists included.

A user deciding whether a budget fits their afternoon reads it within the run's first minute on a
small model, once the first trial is timed; on a model whose trial takes longer, the line after
loading says what is known then. Nothing here is guessed from the model's size: every figure is a
clock reading of this run.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from skipsearch.run.finalists import FINALISTS

# A finalist is measured again in `rounds` mode, 2-4 passes of the estimator where a trial makes one:
# priced at 3 trials each.
FINALIST_TRIALS = 3
RECENT = 10  # trials whose median times the next ones (a trial's time drifts with the space's region)
CHANGE = 0.2  # a new estimate is printed when the total moves by more than this share


def peak_memory() -> int:
    """Bytes of this process's peak resident memory (Linux counts `ru_maxrss` in KiB, macOS in bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class SearchClock:
    """The clock of one search: `loaded()` once the model and reference states are ready, `trial()`
    after each trial that used budget; each returns the line to print, or None when nothing new is
    known. The first `untimed` trials are not timed: a run that drafts beyond layers scores the
    draft that keeps every layer first, which makes no int8/int4 copies and reads as a trial of about
    half the time of those that follow (1.8 s against 2.3-3.7 s in the demo). `clock` is injectable
    for tests."""

    budget: int
    clock: Callable[[], float] = time.monotonic
    untimed: int = 0
    began: float = field(default=0.0)
    ready: float | None = None
    last: float | None = None
    intervals: list[float] = field(default_factory=list)
    printed_total: float | None = None

    def __post_init__(self) -> None:
        self.began = self.clock()

    def loaded(self) -> str:
        self.ready = self.last = self.clock()
        return (
            f"search cost: model and reference states ready in {_duration(self.ready - self.began)}, "
            f"peak memory {peak_memory() / 1e9:.1f} GB; a trial's time is measured on the first trials"
        )

    def trial_seconds(self) -> float | None:
        """The median of the latest trials' times (None before the first)."""
        return statistics.median(self.intervals[-RECENT:]) if self.intervals else None

    def total_seconds(self, scored: int) -> float | None:
        """The run's predicted wall time: what has passed, the trials left and the finalists."""
        per_trial = self.trial_seconds()
        if per_trial is None:
            return None
        left = max(self.budget - scored, 0) + FINALISTS * FINALIST_TRIALS
        return self.clock() - self.began + left * per_trial

    def trial(self, scored: int, budget: int) -> str | None:
        now = self.clock()
        if self.last is not None:
            if self.untimed > 0:
                self.untimed -= 1
            else:
                self.intervals.append(now - self.last)
        self.last = now
        self.budget = budget
        total = self.total_seconds(scored)
        if total is None:
            return None
        if self.printed_total is not None and (
            scored >= budget or abs(total - self.printed_total) <= CHANGE * self.printed_total
        ):
            return None  # said already, or nothing left to estimate
        self.printed_total = total
        per_trial = self.trial_seconds()
        left = max(budget - scored, 0)
        return (
            f"search cost after {len(self.intervals)} timed trial{'s' if len(self.intervals) != 1 else ''}: "
            f"a trial {per_trial:.1f} s, {left} left ({_duration(left * per_trial)}) and "
            f"{FINALISTS} finalists ({_duration(FINALISTS * FINALIST_TRIALS * per_trial)}); "
            f"about {_duration(total)} in all, peak memory {peak_memory() / 1e9:.1f} GB"
        )
