"""How torch's CPU threads wait, so that a core another process keeps busy does not stall decoding.

torch runs its CPU kernels on OpenMP threads, one per core. With OpenMP's default wait policy a
thread that finishes its share of a parallel region spins, waiting for the next; when another
process holds one of the cores, the thread scheduled there is descheduled mid-kernel, and every
parallel region waits for it. `OMP_WAIT_POLICY=PASSIVE` makes idle threads sleep instead: on the
project's 2-core CPU with one core busy, a SmolLM2 bf16 step went from 49.8 ms (default) to
33.3 ms, within 1.5x of the idle step (results/threads/busy_core.md measures both, idle and busy).

OpenMP reads the policy once, when the runtime starts, so `prefer_passive_waiting` must run before
torch is imported; a user's own `OMP_WAIT_POLICY` is kept. Pure: no torch.
"""

from __future__ import annotations

import logging
import os
import sys

WAIT_POLICY = "PASSIVE"

log = logging.getLogger(__name__)


def prefer_passive_waiting() -> None:
    """Set `OMP_WAIT_POLICY=PASSIVE` unless the user set a policy or torch already started."""
    if "torch" in sys.modules:
        log.debug("torch is already imported: OpenMP's wait policy stays as it started")
        return
    os.environ.setdefault("OMP_WAIT_POLICY", WAIT_POLICY)


def busy_cpu_warning() -> str | None:
    """A warning when the 1-minute load average exceeds the cores: timings will be noisy and slow."""
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load <= cores:
        return None
    return (
        f"load average {load:.2f} exceeds the {cores} cores: other processes share the CPU, so "
        "timings are slower and noisier than on an idle machine"
    )
