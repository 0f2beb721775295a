"""A decode's products shared with the busy cores, on a machine with one core free (issue 19, item 5).

When other processes keep all cores but one busy, `cpu.threads` gives torch one thread, so no
parallel kernel waits for a thread the busy core deschedules. But a memory-bound step on one core
reads at that core's bandwidth, about half of two cores' (on a 2-core CPU with AMX, SmolLM2's step
took 1.8x its idle time: docs/cpu-backend.md, "Threads and shared cores under load"). The busy cores
still lend their threads a share of their time. `shared_core.h` lets skipsearch's product kernels
(`linear_rows.c`, `linear_rows_amx.c`, and the lower-precision drafts' `linear_rows_int.c`) use it:
helper threads pinned to the busy cores take pieces of each product while they run, and the decoding
thread, pinned to the free core, takes back any piece a helper has not finished within 20 us, so it
never waits for a descheduled helper. Every output is the bits one thread computes.

The plan is chosen at load (`choose_shared_cores`, from the thread choice and each core's busy
share) and recorded in the kernel plan's line; a decode engages the helpers around its loop
(`engaged`), because a helper late for a taken-back piece may still read that product's weights
for a moment: disengaging waits until it has let go, so a model is never freed under it.

Each library holds its own helpers (`shared_core.h`'s state is per library): a decode engages the
plan's bf16 kernel's and those of the int kernels' builds loaded so far (`int_linear.loaded_libraries`),
so a draft on int8/int4 fused layers shares its products as the bf16 steps do. What that costs: one
more helper thread per build on each busy core, which spins at most 2 ms after its library's last
piece and then sleeps (a decode alternating int drafts and bf16 verifies has both libraries' helpers
spinning for up to 2 ms at each switch), and a build engaged but never used spins 2 ms once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from skipsearch.cpu import int_linear
from skipsearch.cpu.bf16_weights import KERNELS, kernel_library
from skipsearch.cpu.native import NativeLibrary


@dataclass(frozen=True)
class SharedCores:
    """The free core the decoding thread runs on, the busy cores its helpers run on, and the
    products' kernel (`VECTOR` or `TILES`), whose library runs them."""

    caller: int
    helpers: tuple[int, ...]
    kernel: str

    def describe(self) -> str:
        cores = ", ".join(str(core) for core in self.helpers)
        return (
            f"the products shared with a helper on busy core {cores}, which the step never waits "
            f"for, the decoding thread on core {self.caller} (cpu.shared_core)"
        )


MAX_HELPERS = 8  # shared_core.h


def choose_shared_cores(
    threads: int, shares: Sequence[float], kernel: str | None, allowed: Iterable[int] | None = None
) -> SharedCores | None:
    """Helpers on the busy cores where one thread is all the load leaves (`threads` == 1 of
    several cores) and the products run on skipsearch's kernels (`kernel`, None where they do not);
    the decoding thread on the least busy core. `shares`: each core's busy share, 0-1; `allowed`:
    the cores this process may run on (its affinity, by default; /proc/stat lists them all)."""
    cores = sorted(set(os.sched_getaffinity(0) if allowed is None else allowed) & set(range(len(shares))))
    if threads != 1 or len(cores) < 2 or kernel not in KERNELS or kernel_library(kernel).function is None:
        return None
    caller = min(cores, key=lambda core: shares[core])
    helpers = tuple(core for core in cores if core != caller)[:MAX_HELPERS]
    return SharedCores(caller, helpers, kernel)


_plan: SharedCores | None = None
_engaging = threading.Lock()  # held while the helpers are engaged
_owner: int | None = None  # the thread that engaged them


def set_plan(plan: SharedCores | None) -> None:
    """The process's plan, from `load_model`: like torch's thread count, one for the process."""
    global _plan
    _plan = plan


@contextlib.contextmanager
def engaged() -> Iterator[SharedCores | None]:
    """The helpers engaged for the calling thread while the block runs, where the plan has them;
    yields the plan while they are engaged for this thread, else None. A nested block, or one on
    another thread while they are engaged, runs as the enclosing one does. The helpers are the plan
    kernel's and those of the int kernels' builds loaded so far (module docstring)."""
    global _owner
    plan = _plan
    if plan is None or not _engaging.acquire(blocking=False):
        yield plan if plan is not None and _owner == threading.get_ident() else None
        return
    try:
        with contextlib.ExitStack() as stack:
            cpus = (ctypes.c_int * len(plan.helpers))(*plan.helpers)
            libraries = [kernel_library(plan.kernel), *int_linear.loaded_libraries()]
            for index, library in enumerate(libraries):
                handle = library.handle
                if handle.shared_core_engage(plan.caller, cpus, len(plan.helpers)) != 0:
                    if index == 0:  # the plan's own kernel: no helpers at all
                        break
                    continue  # an int build without helpers runs on its OpenMP threads
                stack.callback(handle.shared_core_disengage)  # in reverse: the caller's first mask last
            else:
                _owner = threading.get_ident()
                try:
                    yield plan
                finally:
                    _owner = None
                return
        yield None
    finally:
        _engaging.release()


def _library(kernel: str | NativeLibrary) -> NativeLibrary:
    return kernel_library(kernel) if isinstance(kernel, str) else kernel


def hold_next_piece(kernel: str | NativeLibrary, microseconds: int) -> None:
    """Make the next piece of `kernel` (a bf16 kernel's name, or an int kernel's library) a helper
    claims wait `microseconds` before it is computed, as a descheduled helper's would (for the tests
    of taking pieces back)."""
    _library(kernel).handle.shared_core_hold(ctypes.c_long(microseconds))


def piece_counts(kernel: str | NativeLibrary) -> tuple[int, int]:
    """Pieces of `kernel`'s products (a bf16 kernel's name, or an int kernel's library) the helpers
    computed, and pieces the decoding thread took back from them, since the process loaded the
    kernel (for experiments)."""
    handle = _library(kernel).handle
    done, taken = ctypes.c_long(), ctypes.c_long()
    handle.shared_core_counts(ctypes.byref(done), ctypes.byref(taken))
    return done.value, taken.value
