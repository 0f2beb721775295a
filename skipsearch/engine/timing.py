"""Where a speculative round's time goes: draft, verify, accept/sample, cache ops, other.

docs/theory.md, "Bottleneck share": the speedup ceiling is set by the share of a round that
speculation cannot compress (`1 / (1 - s)`, Amdahl), so every round is split into phases and
recorded with its context length — draft and verify attention grow with context, so the shares move
with it.
- draft: the γ draft steps, including choosing each draft token;
- verify: the full-model pass over the round's positions (layers `< s1` only for the last one);
- sample: target probabilities, accept / resample, the bonus token;
- cache: cropping scratch K/V, rollback, the length check;
- other: the remainder of the round's wall time (Python bookkeeping, γ controller).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch

from skipsearch.models.device import device_sync

TIMED_PHASES = ("draft", "verify", "sample", "cache")
PHASES = (*TIMED_PHASES, "other")
BUCKETS = ("short", "medium", "long")


@dataclass(frozen=True)
class RoundTiming:
    """Seconds per phase of one round; `context` = committed tokens when the round started."""

    context: int
    gamma: int
    accepted: int
    draft: float
    verify: float
    sample: float
    cache: float
    other: float

    @property
    def total(self) -> float:
        return sum(getattr(self, phase) for phase in PHASES)

    def to_dict(self) -> dict:
        return asdict(self)


class RoundClock:
    """Accumulates phase times within a round; when `timed`, the device is synchronised at phase
    boundaries.

    CUDA kernels run asynchronously, so without a sync a phase would be charged for the kernels
    its predecessor queued. But a sync per phase boundary (twelve a round) stalls the host
    until the device drains its queue, so the next CUDA-graph replay waits for the host to queue
    it: the breakdown slows the rounds it measures. It is opt-in: an untimed clock never
    synchronises, never reads the time, and records no round (`finish` returns None).
    """

    def __init__(self, device: torch.device, timed: bool) -> None:
        self.timed = timed
        self.sync: Callable[[], None] = device_sync(device)
        self.began = 0.0
        self.spent = dict.fromkeys(TIMED_PHASES, 0.0)

    def start(self) -> None:
        if not self.timed:
            return
        self.sync()
        self.spent = dict.fromkeys(TIMED_PHASES, 0.0)
        self.began = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.timed:
            yield
            return
        self.sync()
        began = time.perf_counter()
        yield
        self.sync()
        self.spent[name] += time.perf_counter() - began

    def finish(self, context: int, gamma: int, accepted: int) -> RoundTiming | None:
        """The round's record, or None when untimed."""
        if not self.timed:
            return None
        self.sync()
        total = time.perf_counter() - self.began
        other = max(0.0, total - sum(self.spent.values()))
        return RoundTiming(context, gamma, accepted, **self.spent, other=other)


@dataclass(frozen=True)
class PhaseStats:
    """One phase within a context bucket: per-round P50 / P95 seconds and share of round time."""

    phase: str
    p50: float
    p95: float
    share: float


@dataclass(frozen=True)
class Bucket:
    """Rounds whose context length falls in `[low, high]`."""

    name: str
    low: int
    high: int
    rounds: int
    phases: tuple[PhaseStats, ...]
    round_p50: float
    round_p95: float

    def to_dict(self) -> dict:
        return asdict(self)


def breakdown(records: Sequence[RoundTiming]) -> list[Bucket]:
    """Split rounds into terciles of context length (short / medium / long) and summarise each.

    Terciles of the measured contexts always fill three buckets whatever the prompt lengths; the
    bucket's `[low, high]` says what short meant in this run. A phase's share is its summed time
    over the bucket's summed round time — the bottleneck share (docs/theory.md, "Bottleneck share").
    """
    ordered = sorted(records, key=lambda r: r.context)
    buckets: list[Bucket] = []
    for name, chunk in zip(BUCKETS, np.array_split(np.arange(len(ordered)), len(BUCKETS)), strict=True):
        rounds = [ordered[i] for i in chunk]
        if not rounds:
            continue
        totals = np.array([r.total for r in rounds])
        phases = []
        for phase in PHASES:
            times = np.array([getattr(r, phase) for r in rounds])
            share = float(times.sum() / totals.sum()) if totals.sum() > 0 else 0.0
            phases.append(PhaseStats(phase, *_p50_p95(times), share))
        buckets.append(
            Bucket(name, rounds[0].context, rounds[-1].context, len(rounds), tuple(phases), *_p50_p95(totals))
        )
    return buckets


def _p50_p95(values: np.ndarray) -> tuple[float, float]:
    p50, p95 = np.percentile(values, [50, 95])
    return float(p50), float(p95)
