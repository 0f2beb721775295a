"""How many CPU threads a decode uses, fitted to the load at start-up (issue 19, item 5).

torch runs its CPU kernels on OpenMP threads, one per core by default, and OpenMP's default wait
policy lets a thread spin between parallel regions. On an idle machine that is the fastest choice.
When another process keeps one core busy, the thread that shares its core is descheduled mid-kernel
and every parallel region waits for it: on a 2-core CPU a SmolLM2 bf16 step went from 22 ms to 47
ms. One thread fewer than the cores that are free does not wait for anyone (30 ms), and sleeping
instead of spinning (`OMP_WAIT_POLICY=PASSIVE`) helps less when busy (34 ms) and costs an idle
machine 64% (36 ms): docs/cpu-backend.md, "Threads and shared cores under load". So at start-up the
busy cores are read from /proc/stat and torch gets one thread per free core; a thread count the user
chose (`OMP_NUM_THREADS`, or fewer threads than cores already set) is kept. The reading is the least
busy of a few short windows: a process that keeps a core busy shows in each, a command that ran for
a moment in one. Read over one 0.2 s window, a shell command run beside a decode's start once
counted as 0.6 of a core and gave an idle machine one thread, 1.8x slower.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

SAMPLE_SECONDS = 0.1  # one window
WINDOWS = 3  # consecutive windows; the least busy counts
PROC_STAT = Path("/proc/stat")


def _cpu_times(path: Path) -> list[tuple[int, int]] | None:
    """(busy, total) jiffies since boot of all cores, then of each core; None where /proc/stat
    cannot be read."""
    try:
        rows = [line.split() for line in path.read_text().splitlines() if line.startswith("cpu")]
    except OSError:
        return None
    times = []
    for row in rows:
        values = [int(v) for v in row[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
        times.append((sum(values) - idle, sum(values)))
    return times or None


def _share(before: tuple[int, int], after: tuple[int, int]) -> float:
    return (after[0] - before[0]) / (after[1] - before[1]) if after[1] != before[1] else 0.0


def busy_shares(
    seconds: float = SAMPLE_SECONDS, path: Path = PROC_STAT, windows: int = WINDOWS
) -> tuple[float, tuple[float, ...]]:
    """Cores other processes keep busy now, and each core's busy share (0-1), in the least busy of
    `windows` consecutive windows of `seconds` (this process sleeps meanwhile); the 1-minute load
    average and no shares where /proc/stat is unreadable."""
    cores = os.cpu_count() or 1
    first = _cpu_times(path)
    if first is None:
        return min(os.getloadavg()[0], cores), ()
    readings = [first]
    for _ in range(windows):
        time.sleep(seconds)
        reading = _cpu_times(path)
        if reading is None or len(reading) != len(first):
            break
        readings.append(reading)
    if len(readings) < 2:
        return 0.0, ()
    before, after = min(itertools.pairwise(readings), key=lambda pair: _share(pair[0][0], pair[1][0]))
    per_core = tuple(_share(b, a) for b, a in zip(before[1:], after[1:], strict=True))
    return cores * _share(before[0], after[0]), per_core


def busy_cores(seconds: float = SAMPLE_SECONDS, path: Path = PROC_STAT, windows: int = WINDOWS) -> float:
    """Cores other processes keep busy now (`busy_shares`)."""
    return busy_shares(seconds, path, windows)[0]


BUSY = 0.5  # cores other processes use, from which timings are flagged as shared


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    reason: str
    busy: float = 0.0  # cores other processes used when the choice was made (0 when not measured)
    shares: tuple[float, ...] = ()  # each core's busy share then (empty when not measured)


def choose_threads(current: int, cores: int, busy: float, user_set: bool) -> ThreadChoice:
    """One thread per core that is not busy, unless the user chose the count."""
    if user_set or current < cores:
        return ThreadChoice(current, f"{current} thread(s), as set", busy)
    free = max(1, cores - round(busy))
    if free == cores:
        return ThreadChoice(
            cores, f"{cores} thread(s), one per core (other processes use {busy:.1f} cores)", busy
        )
    return ThreadChoice(
        free,
        f"{free} of {cores} threads: other processes keep {busy:.1f} cores busy, and a thread on a busy "
        "core stalls every parallel kernel",
        busy,
    )


def fit_threads_to_load() -> ThreadChoice:
    """Set torch's intra-op threads from the cores other processes leave free (module docstring)."""
    import torch

    cores = os.cpu_count() or 1
    current = torch.get_num_threads()
    user_set = "OMP_NUM_THREADS" in os.environ
    busy, shares = (0.0, ()) if user_set or current < cores else busy_shares()
    choice = dataclasses.replace(choose_threads(current, cores, busy, user_set), shares=shares)
    if choice.threads != current:
        torch.set_num_threads(choice.threads)
    return choice


def busy_cpu_warning(busy: float | None = None) -> str | None:
    """A warning when other processes keep at least `BUSY` of a core busy (measured now unless
    given): timings are then slower and noisier than on an idle machine. Measured while this
    process sleeps, not from the load average, which counts this process's own threads and lags
    a minute behind a job that just ended."""
    busy = busy_cores() if busy is None else busy
    if busy < BUSY:
        return None
    return (
        f"other processes keep {busy:.1f} of the {os.cpu_count() or 1} cores busy, so timings are "
        "slower and noisier than on an idle machine"
    )
