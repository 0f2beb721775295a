"""Clocks for timing one call on a device: host wall time on a CPU, CUDA events on a GPU.

Imports torch only inside the CUDA clock, so the profiler's module loads without it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
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
