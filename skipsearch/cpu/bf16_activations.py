"""Whether `--dtype auto` on a CPU with native bf16 runs bf16 activations, or the fallback plan's
float32 activations on the same bf16 weights: the first half of that CPU's kernel plan, measured
once per machine (docs/cpu-backend.md).

Both plans read every weight matrix in bf16, so a decode step reads the same weight bytes; they
differ in who multiplies. The bf16 plan hands every product to oneDNN on prepacked weights
(`cpu.packed`); the fallback plan runs skipsearch's kernels: `linear_rows.c` widens the bf16 weights
to float32 (`cpu.bf16_weights`), and its decoder layers run fused (`cpu.fused_layers`). A CPU's
flags say which instructions it has, not which plan is faster, and two CPUs with native bf16
disagree: on one with avx512_bf16 and no AMX, oneDNN's packed bf16 products made the bf16 plan
1.9-2.3x faster than fp32; on one with AMX, oneDNN paid about 25 µs a call whatever the matrix (a
576 -> 192 projection read its weights at 6 GB/s, an 8 MB matrix at 35) where the kernel read them
at 14-50 GB/s, and a SmolLM2 step took 37 ms in bf16 against 23 ms on the fallback plan
(docs/cpu-backend.md, "The plans by CPU").

So the products of a decoder layer are timed both ways, at one row (a decode or draft step) and at
four (a verify of 3 drafts): a SmolLM2 layer's seven projections, through `PROBE_LAYERS` copies so
each call reads its weights from memory as a step does, and the fallback plan runs where it is
faster by `DECISIVE`. A measurement taken while other processes kept a core busy is not kept
(`cpu.choices.keep_choice`): this process keeps answering with it, and the next process measures
again. The float32 activations cost nothing in exactness: the weights are the same bf16 values,
and every pass of up to 16 positions is the same bits whatever its row count, so greedy SSD equals
autoregressive decoding token for token with no tolerance at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch

from skipsearch.cpu.bf16_weights import Bf16WeightLinear, load_kernel
from skipsearch.cpu.choices import DECISIVE, choice_path, keep_choice, median_ms, read_choice

# (inputs, outputs) of a SmolLM2 decoder layer's products: q, k, v, o, gate, up, down.
PROBE_SHAPES = ((576, 576), (576, 192), (576, 192), (576, 576), (576, 1536), (576, 1536), (1536, 576))
PROBE_LAYERS = 16  # 57 MB of bf16 weights: past a server CPU's per-core caches, as a model's are
PROBE_ROWS = (1, 4)
PROBE_REPEATS = 9
CHOICE_NAME = "bf16-activations"
BF16, FLOAT32 = "bf16", "float32"  # the activations of the two plans
PLAN_NAMES = {
    BF16: "oneDNN's bf16 products on prepacked weights",
    FLOAT32: "skipsearch's kernel on bf16 weights, float32 activations",
}


# Choices measured in this process but not kept (other processes kept a core busy), by path: a run
# asks several times (its LatencyProfile's path, its preflight, its load), and must get one answer without
# measuring each time.
_UNKEPT: dict[Path, ActivationChoice] = {}


@dataclass(frozen=True)
class ActivationChoice:
    """The activations a CPU with native bf16 runs (`BF16` or `FLOAT32`), and the measurement: µs
    per decoder layer's products by plan and row count; the build of the kernel measured (a changed
    kernel is measured again), or why it could not be."""

    activations: str
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    kernel_build: str = ""
    unavailable: str = ""

    def describe(self) -> str:
        if not self.timings:
            return f"{PLAN_NAMES[self.activations]} (the kernel is not available: {self.unavailable})"
        cells = "; ".join(
            f"{PLAN_NAMES[plan].split(' on ')[0]} " + ", ".join(f"{us:.0f}" for us in by_rows.values())
            for plan, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values())))
        return f"{PLAN_NAMES[self.activations]} (µs per decoder layer's products at {rows} rows: {cells})"


def measure_layer_products() -> dict[str, dict[str, float]]:
    """Median µs per decoder layer's products in each plan at each row count, the best of three
    interleaved medians, cycling through `PROBE_LAYERS` layers' weights."""
    generator = torch.Generator().manual_seed(0)
    weights = [
        torch.randn(outputs, inputs, generator=generator) / inputs**0.5
        for _ in range(PROBE_LAYERS)
        for inputs, outputs in PROBE_SHAPES
    ]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(weight.bfloat16(), 1) for weight in weights]
    kernel = [Bf16WeightLinear(weight, None) for weight in weights]

    def bf16_layers(inputs: dict[int, torch.Tensor]) -> None:
        for packed in onednn:
            torch.ops.mkldnn._linear_pointwise(inputs[packed.shape[1]], packed, None, "none", [], "")

    def float32_layers(inputs: dict[int, torch.Tensor]) -> None:
        for product in kernel:
            product(inputs[product.in_features])

    timings: dict[str, dict[str, float]] = {BF16: {}, FLOAT32: {}}
    widths = {inputs for inputs, _ in PROBE_SHAPES}
    with torch.no_grad():
        for rows in PROBE_ROWS:
            hidden = {width: torch.randn(1, rows, width, generator=generator) for width in widths}
            calls = {
                BF16: partial(bf16_layers, {width: x.bfloat16() for width, x in hidden.items()}),
                FLOAT32: partial(float32_layers, hidden),
            }
            for call in calls.values():
                call()  # warm-up
            rounds = [
                {plan: median_ms(call, PROBE_REPEATS) * 1e3 / PROBE_LAYERS for plan, call in calls.items()}
                for _ in range(3)
            ]
            for plan in calls:
                timings[plan][str(rows)] = min(medians[plan] for medians in rounds)
    return timings


def _cached(path: Path, build: str) -> ActivationChoice | None:
    """The stored choice, unless damaged, of an older form, or made with another kernel build."""
    cached = read_choice(path, ActivationChoice)
    valid = cached is not None and cached.activations in PLAN_NAMES and cached.kernel_build == build
    return cached if valid else None


def choose_activations() -> ActivationChoice:
    """The faster plan for a CPU with native bf16 (module docstring), measured once and cached:
    float32 activations only where they lead by `DECISIVE` (a dtype that flipped between
    processes would split a run's LatencyProfile and conversion caches), bf16 otherwise and where the
    kernel does not load here."""
    kernel = load_kernel()
    if kernel.function is None or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return ActivationChoice(BF16, unavailable=kernel.reason or "oneDNN runs no bf16 here")
    path = choice_path(CHOICE_NAME)
    cached = _cached(path, kernel.build) or _UNKEPT.get(path)
    if cached is not None:
        return cached
    timings = measure_layer_products()
    bf16, float32 = (sum(timings[plan].values()) for plan in (BF16, FLOAT32))
    choice = ActivationChoice(FLOAT32 if float32 < (1 - DECISIVE) * bf16 else BF16, timings, kernel.build)
    if not keep_choice(path, choice, "the bf16 and float32 activations"):
        _UNKEPT[path] = choice
    return choice
