"""Choices the CPU backend measures once per machine and caches (`choice_path`, `read_choice`,
`keep_choice`), and the clocks they measure with (`median_ms`, and `pass_samples` for whole passes
of a model on several plans). A choice measured while other processes keep a core busy is not
kept: it would be that load's, not this machine's (docs/cpu-backend.md, "How the plan is chosen").
"""

from __future__ import annotations

import json
import logging
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch

from skipsearch.cpu.threads import BUSY, busy_cores
from skipsearch.store import kernel_choice_path, write_text_atomic

PROBE_REPEATS = 9
DECISIVE = 0.15  # the least relative gap between two candidates that decides
Choice = TypeVar("Choice")  # a measured choice's dataclass (`read_choice`, `keep_choice`)

log = logging.getLogger(__name__)


def median_ms(call: Callable[[], Any], repeats: int = PROBE_REPEATS) -> float:
    """Median milliseconds of `repeats` calls (the kernel plan's probes)."""
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return sorted(times)[len(times) // 2] * 1e3


def pass_samples(
    runners: Mapping[str, Any], context: int, positions: Sequence[int], rounds: int, repeats: int
) -> dict[tuple[str, int], list[float]]:
    """Whole passes of each of `runners` (layer-wise runners of one model on different plans) over
    each of `positions` new positions after `context` cached ones: per (runner, positions), one
    `median_ms` of `repeats` passes a round, the cells interleaved in an order that flips every
    round, so a drift of the machine falls on every plan alike. Each pass's K/V is cropped off after
    it, so every pass sees the same context (the probes that choose a plan on whole steps)."""
    first = next(iter(runners.values()))
    generator = torch.Generator().manual_seed(context)
    ids = torch.randint(0, first.config.vocab_size, (1, context + max(positions)), generator=generator)
    ids = ids.to(first.device)
    caches = {}
    with torch.no_grad():
        for name, runner in runners.items():
            caches[name] = runner.new_cache()
            runner.forward(ids[:, :context], cache=caches[name])

        def one_pass(name: str, rows: int) -> None:
            runners[name].forward(ids[:, context : context + rows], cache=caches[name])
            for layer in caches[name].layers:
                layer.crop(-rows)

        cells = [(name, rows) for rows in positions for name in runners]
        for cell in cells:
            one_pass(*cell)  # warm-up
        samples: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
        for round_ in range(rounds):
            for cell in cells if round_ % 2 == 0 else cells[::-1]:
                samples[cell].append(median_ms(partial(one_pass, *cell), repeats))
    return samples


def choice_path(dtype_name: str) -> Path:
    """One measurement per machine, torch version and dtype, and per thread count where the user
    set one (`OMP_NUM_THREADS`): a one-thread process read SmolLM2's step faster on the vector
    kernel and cached that for the default processes after it."""
    machine = f"{platform.machine()}-{platform.processor() or 'cpu'}-torch{torch.__version__}"
    threads = os.environ.get("OMP_NUM_THREADS")
    return kernel_choice_path(machine, f"{dtype_name}-omp{threads}" if threads else dtype_name)


def read_choice(path: Path, kind: type[Choice]) -> Choice | None:
    """The choice `keep_choice` kept at `path` (a `kind` dataclass), or None where there is none,
    or it is damaged or of an older form; the caller checks that it still holds."""
    try:
        return kind(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def keep_choice(path: Path, choice: Any, what: str) -> bool:
    """Cache a measured choice (a dataclass) for every later process on this machine, unless
    other processes keep a core busy now: a measurement shared with them is not this machine's
    (a probe run beside a test suite read oneDNN/MKL 0.83 where idle it reads 0.45), and a cached
    choice is never measured again. Returns whether it was kept."""
    busy = busy_cores()
    if busy >= BUSY:
        log.warning("%s were measured while other processes kept %.1f cores busy: not kept", what, busy)
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(asdict(choice), indent=1))
    return True
