"""Whether fp32 weights are packed for oneDNN on this CPU: the linear half of the fallback plan,
measured once per machine (docs/theory.md, "The kernel plan").

A CPU without native bf16 runs the plan in float32, where `F.linear` goes to MKL. On an AVX2-only
AMD EPYC (Zen 3) MKL's fp32 products streamed the weights at 4-11 GB/s at one row and cost about
one more product for every extra row, while the same products on weights packed once for oneDNN
(`models.packed`) took half the time for the LM heads and half the extra for a 4-row verify
(results/kernels/linear_rows-*-avx2-float32*.md). Which library is faster depends on the CPU and
the library builds, so it is measured, like the attention path: both products on a probe shape at
one and four rows, over more weight bytes than a server CPU's last-level cache, kept only where one
is faster by `DECISIVE`.

Packing is used only where `--dtype auto` chose float32. `--dtype float32` stays on MKL, the exact
reference: oneDNN's fp32 product gives other bits than MKL's, and its rows depend on how many rows
a call has, so a verify may differ from single steps in the last bit (the lossless check's measured
tolerance covers that, as it does for bf16).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from skipsearch.models.kernels import DECISIVE, choice_path, keep_choice, median_ms

PROBE_IN, PROBE_OUT = 1024, 4096
PROBE_ROWS = (1, 4)
PROBE_MATRICES = 4  # 64 MB of fp32 weights: past a server CPU's last-level cache, as a model's are
PROBE_REPEATS = 9
CHOICE_NAME = "float32-linear"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Fp32Packing:
    """Whether fp32 weights are packed, and the measurement: median ms per probe product, by
    library (`mkl`: `F.linear`; `onednn`: the packed product) and row count."""

    packs: bool
    timings: dict[str, dict[str, float]] = field(default_factory=dict)

    def describe(self) -> str:
        cells = "; ".join(
            f"{library} " + ", ".join(f"{ms:.2f}" for ms in by_rows.values())
            for library, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values()), {}))
        chosen = "packed for oneDNN" if self.packs else "left to MKL"
        return f"fp32 weights {chosen} (ms per {PROBE_IN}x{PROBE_OUT} product at {rows} rows: {cells})"


def measure_fp32_products() -> dict[str, dict[str, float]]:
    """Median ms per product of each library at each row count, the best of three interleaved
    medians, cycling through `PROBE_MATRICES` weights so each call reads its weight from memory."""
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(PROBE_OUT, PROBE_IN, generator=generator) for _ in range(PROBE_MATRICES)]
    packed = [torch.ops.mkldnn._reorder_linear_weight(w, 1) for w in weights]
    timings: dict[str, dict[str, float]] = {"mkl": {}, "onednn": {}}
    with torch.no_grad():
        for rows in PROBE_ROWS:
            x = torch.randn(1, rows, PROBE_IN, generator=generator)

            def mkl(x: torch.Tensor = x) -> None:
                for w in weights:
                    F.linear(x, w)

            def onednn(x: torch.Tensor = x) -> None:
                for w in packed:
                    torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")

            calls = {"mkl": mkl, "onednn": onednn}
            for call in calls.values():
                call()  # warm-up
            rounds = [
                {name: median_ms(call, PROBE_REPEATS) / PROBE_MATRICES for name, call in calls.items()}
                for _ in range(3)
            ]
            for name in calls:
                timings[name][str(rows)] = min(medians[name] for medians in rounds)
    return timings


def choose_fp32_packing() -> Fp32Packing:
    """Whether this CPU's fp32 products are faster packed for oneDNN, measured once and cached.

    Packed when oneDNN's summed time over one and four rows is below MKL's by `DECISIVE`; a
    measurement that decides nothing (alike within `DECISIVE`), or one taken while other processes
    kept a core busy (`kernels.keep_choice`), leaves it uncached, so a later process measures again.
    """
    if not torch.backends.mkldnn.is_available():
        return Fp32Packing(False)
    path = choice_path(CHOICE_NAME)
    try:
        return Fp32Packing(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass
    timings = measure_fp32_products()
    mkl, onednn = (sum(timings[name].values()) for name in ("mkl", "onednn"))
    choice = Fp32Packing(onednn < (1 - DECISIVE) * mkl, timings)
    if abs(mkl - onednn) < DECISIVE * max(mkl, onednn):
        log.warning("fp32 products measured alike (%s); is the CPU busy? not kept", choice.describe())
        return choice
    keep_choice(path, choice, "the fp32 products")
    return choice
