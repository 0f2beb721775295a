"""Which product the fp32 fallback plan's linear layers run on this CPU: the linear half of that
plan, measured once per machine (docs/cpu-backend.md).

A CPU without native bf16 runs the plan in float32, where `F.linear` goes to MKL. On an AVX2-only
CPU MKL's fp32 products streamed the weights at 4-11 GB/s at one row and cost about one more product
for every extra row; the same products on weights packed once for oneDNN (`cpu.packed`) took half
the time for the LM heads and half the extra for a 4-row verify; and skipsearch's kernel
(`cpu.bf16_weights`), which streams bf16 copies of the weights once per call in float32 arithmetic,
ran at 12-15 GB/s with 4 rows costing 1.0-1.3 single rows (docs/cpu-backend.md, "bf16 weights in
float32 arithmetic"). Which is fastest depends on the CPU and the library builds, so it is measured,
like the attention path: each product on a probe shape at one and four rows, over more weight bytes
than a server CPU's last-level cache, kept only where the fastest leads the next by `DECISIVE`.

Only `--dtype auto` runs this choice. `--dtype float32` stays on MKL, the exact reference:
oneDNN's fp32 product gives other bits than MKL's, and its rows depend on how many rows a call has
(the lossless check's measured tolerance covers that, as it does for bf16); the kernel rounds the
weights to bf16, the values `--dtype auto` runs on a CPU with native bf16 too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from skipsearch.cpu.bf16_weights import Bf16WeightLinear, load_kernel
from skipsearch.cpu.choices import DECISIVE, choice_path, keep_choice, median_ms, read_choice

PROBE_IN, PROBE_OUT = 1024, 4096
PROBE_ROWS = (1, 4)
PROBE_MATRICES = 4  # 64 MB of fp32 weights: past a server CPU's last-level cache, as a model's are
PROBE_REPEATS = 9
CHOICE_NAME = "float32-linear"
MKL, ONEDNN, BF16_KERNEL = "mkl", "onednn", "bf16-kernel"
LIBRARY_NAMES = {
    MKL: "fp32 weights left to MKL",
    ONEDNN: "fp32 weights packed for oneDNN",
    BF16_KERNEL: "weights in bf16 for skipsearch's kernel, float32 arithmetic",
}

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fp32Linear:
    """The product the fallback plan's linear layers run (a key of `LIBRARY_NAMES`), and the
    measurement: median ms per probe product, by library and row count; why the kernel was not
    measured, where it was not, and the build of the kernel that was (a changed kernel is
    measured again)."""

    library: str
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    unavailable: str = ""
    kernel_build: str = ""

    def describe(self) -> str:
        cells = "; ".join(
            f"{library} " + ", ".join(f"{ms:.2f}" for ms in by_rows.values())
            for library, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values()), {}))
        kernel = f"; kernel not used: {self.unavailable}" if self.unavailable else ""
        measured = (
            f" (ms per {PROBE_IN}x{PROBE_OUT} product at {rows} rows: {cells}{kernel})" if cells else ""
        )
        return f"{LIBRARY_NAMES[self.library]}{measured}"


def measure_fp32_products() -> dict[str, dict[str, float]]:
    """Median ms per product of each library at each row count, the best of three interleaved
    medians, cycling through `PROBE_MATRICES` weights so each call reads its weight from memory."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(PROBE_OUT, PROBE_IN, generator=generator) for _ in range(PROBE_MATRICES)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]

    def mkl(x: torch.Tensor) -> None:
        for w in weights:
            F.linear(x, w)

    def onednn(x: torch.Tensor) -> None:
        for w in packed:
            torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

    products = {MKL: mkl, ONEDNN: onednn}
    if load_kernel().function is not None:
        kernel_products = [Bf16WeightLinear(w, None) for w in weights]

        def kernel(x: torch.Tensor) -> None:
            for product in kernel_products:
                product(x)

        products[BF16_KERNEL] = kernel
    timings: dict[str, dict[str, float]] = {library: {} for library in products}
    with torch.no_grad():
        for rows in PROBE_ROWS:
            x = torch.randn(1, rows, PROBE_IN, generator=generator)
            calls = {library: partial(product, x) for library, product in products.items()}
            for call in calls.values():
                call()  # warm-up
            rounds = [
                {name: median_ms(call, PROBE_REPEATS) / PROBE_MATRICES for name, call in calls.items()}
                for _ in range(3)
            ]
            for name in calls:
                timings[name][str(rows)] = min(medians[name] for medians in rounds)
    return timings


def _cached(path: Path) -> Fp32Linear | None:
    """The stored choice, unless damaged, of an older form, or made with another build of the
    kernel than the one that loads now (or without it, where it loads now)."""
    cached = read_choice(path, Fp32Linear)
    if cached is None:
        return None
    library = load_kernel()
    stale = library.function is not None and cached.kernel_build != library.build
    return cached if cached.library in LIBRARY_NAMES and not stale else None


def choose_fp32_linear() -> Fp32Linear:
    """The fastest product for this CPU's fp32 fallback plan, measured once and cached.

    The library with the least summed time over one and four rows is chosen. A measurement whose
    two fastest lie within `DECISIVE` of each other decides nothing, and one taken while other
    processes kept a core busy (`cpu.choices.keep_choice`) is not this machine's: either is used but
    not cached, so a later process measures again.
    """
    if not torch.backends.mkldnn.is_available():
        return Fp32Linear(MKL)
    path = choice_path(CHOICE_NAME)
    cached = _cached(path)
    if cached is not None:
        return cached
    timings = measure_fp32_products()
    ranked = sorted(timings, key=lambda library: sum(timings[library].values()))
    kernel = load_kernel()
    choice = Fp32Linear(ranked[0], timings, "" if kernel.function else kernel.reason, kernel.build)
    fastest, runner_up = (sum(timings[library].values()) for library in ranked[:2])
    if runner_up - fastest < DECISIVE * runner_up:
        log.warning("fp32 products measured alike (%s); is the CPU busy? not kept", choice.describe())
        return choice
    keep_choice(path, choice, "the fp32 products")
    return choice
