"""Clocks for timing one call on a device: host wall time on a CPU, CUDA events on a GPU.

Imports torch only inside the CUDA clock, so the profiler's module loads without it.
"""

from __future__ import annotations

import gc
import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class WallClock:
    """Host wall time: on a CPU the call's work is done when it returns."""

    def time(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        start = time.perf_counter()
        out = fn(*args)
        return out, time.perf_counter() - start

    def chain(self, calls: Sequence[Callable[[Any], Any]]) -> tuple[Any, list[float]]:
        """Run `calls` in order, each on the previous one's output (the first on None): the last
        output and the seconds of each call."""
        out, seconds = None, []
        for call in calls:
            out, took = self.time(call, out)
            seconds.append(took)
        return out, seconds


class CudaClock:
    """CUDA events around the call, after a synchronisation: the device's time, not the launch's.

    A call returns once its kernels are queued, so wall time would count the launch only. The
    queue is drained first, so the start event marks the call's first kernel, and the end event
    is waited for. Between the events the device may idle while the host launches the next
    kernel: at one position a sub-layer is launch-bound, and these times include that gap.
    """

    def __init__(self, device: torch.device) -> None:
        import torch

        self.device = device
        self.start = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def time(self, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
        import torch

        torch.cuda.synchronize(self.device)
        self.start.record()
        out = fn(*args)
        self.end.record()
        self.end.synchronize()
        return out, self.start.elapsed_time(self.end) / 1e3

    def chain(self, calls: Sequence[Callable[[Any], Any]]) -> tuple[Any, list[float]]:
        """Run `calls` in order, each on the previous one's output (the first on None): the last
        output and the device seconds of each call, one event recorded between every two calls.

        For calls that each replay a CUDA graph. The queue is drained once, before the first; no
        sync between calls, so the device runs them back to back as in a real pass instead of
        starting each from an idle queue with the host's round trip added. Each interval runs from
        the previous call's last kernel to this call's last: its own kernels, plus any idle time
        while the host launched it — the cost of a separate replay that a pass captured as one
        graph does not pay (`bench.graphed_profile` measures that and takes it off).
        """
        import torch

        events = [torch.cuda.Event(enable_timing=True) for _ in range(len(calls) + 1)]
        torch.cuda.synchronize(self.device)
        events[0].record()
        out = None
        for call, event in zip(calls, events[1:], strict=True):
            out = call(out)
            event.record()
        events[-1].synchronize()
        return out, [start.elapsed_time(end) / 1e3 for start, end in itertools.pairwise(events)]


Sync = WallClock | CudaClock


def clock_for(device: torch.device) -> Sync:
    """The clock for `device`: CUDA events on a GPU, wall time elsewhere."""
    return CudaClock(device) if device.type == "cuda" else WallClock()


def timed(sync: Sync, fn: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    return sync.time(fn, *args)


@contextmanager
def gc_paused() -> Iterator[None]:
    """A collection in the middle of a timed call would land on whichever sub-layer was running."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
