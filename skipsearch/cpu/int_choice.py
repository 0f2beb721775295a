"""Which kernel runs a lower-precision draft's int8 and int4 products on this CPU: ours
(`linear_rows_int.c`, inside the fused layers' driver: `fused_layers.lower_precision_layer`) or
torch's weight-only kernels (`cpu.int_torch`), measured once per machine and set of shapes and
cached as the plan's other choices are (`cpu.choices`; the issue "Drafts at lower precision").

What is timed: one pass over a draft's products at the model's shapes (each decoder layer's as the
fused layers call them: q/k/v together, o, gate/up together, down), at `PROBE_ROWS` rows (1: a
chain's draft step; 4: a token tree's depth), each kernel called directly with its arguments made
beforehand (ours through ctypes, which a fused layer does not even pay; torch's on inputs already
in its dtype, without the conversions a module would add), the kernels interleaved in alternating
order, the fastest of `PROBE_ROUNDS` medians. torch's kernels run at bf16 activations where the CPU
has native bf16 (AVX-512 BF16 or AMX: their fast path; float32 ones take a path 10-30x slower,
`cpu.int_torch`), else at float32. The weights are random values of the right types (values do not
change the time), as many layers as the model has up to `PROBE_WEIGHTS` weights, each layer its own:
so the probe costs about a second, and where the last-level cache holds that many bytes it ranks
the kernels' throughput from cache rather than memory's (the kernels' own benchmark,
experiments/int_kernels.py, streams a whole model).

The rule: torch's kernel runs a precision only where it is faster than ours by more than `TIE` at
every probed row count. Ours is the default because it runs inside the fused driver (no Python
between products, which torch's kernels would need) and a row's bits do not depend on the rows
beside it (a tree's rows are a chain's bits); torch's kernels promise neither.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from skipsearch.cpu import int_linear, int_torch
from skipsearch.cpu.choices import choice_path, keep_choice, median_ms, read_choice
from skipsearch.cpu.dtypes import cpu_flags
from skipsearch.cpu.int_weights import GROUPS, Int4Weight, Int8Weight, common_group

OURS, TORCH = "ours", "torch"
KERNEL_NAMES = {OURS: "skipsearch's int kernels (fused)", TORCH: "torch's weight-only kernels"}
BITS = (8, 4)
PROBE_ROWS = (1, 4)  # a chain's draft step; a token tree's depth
PROBE_ROUNDS = 3
PROBE_REPEATS = 5
PROBE_WEIGHTS = 24_000_000  # the most weights a probe's pass reads (its layers' build stays ~1 s)
TIE = 0.02  # torch's kernel must be this much faster at every row count (module docstring)
NATIVE_BF16 = ("avx512_bf16", "amx_bf16")

_UNKEPT: dict[Path, IntProductsChoice] = {}  # measured in this process but not kept (a busy machine)


@dataclass(frozen=True)
class IntProductsChoice:
    """The kernel of each precision (`"int8"`, `"int4"` -> `OURS` or `TORCH`), the measurement (ms
    per pass by configuration, e.g. `"int8 ours"`, and rows), torch's activations' dtype, the
    builds of ours measured (a changed kernel is measured again), or why nothing was measured."""

    kernels: dict[str, str]
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    torch_dtype: str = ""
    kernel_builds: str = ""
    unavailable: str = ""

    def kernel(self, bits: int) -> str | None:
        """`OURS` or `TORCH` for int`bits` products (None where neither runs here)."""
        return self.kernels.get(f"int{bits}")

    def describe(self) -> str:
        chosen = ", ".join(f"{kind} on {KERNEL_NAMES[kernel]}" for kind, kernel in self.kernels.items())
        if not self.timings:
            return f"lower-precision products: {chosen or 'none'} ({self.unavailable})"
        cells = "; ".join(
            f"{name} " + ", ".join(f"{ms:.2f}" for ms in by_rows.values())
            for name, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values())))
        return (
            f"lower-precision products: {chosen} (ms per pass of the draft's products over {rows} rows, "
            f"torch's at {self.torch_dtype}: {cells})"
        )


def draft_shapes(model: nn.Module) -> tuple[list[tuple[int, int]], int]:
    """`[(out, in)]` of one decoder layer's products as the fused layers call them, and the layers."""
    layers = list(getattr(getattr(model, "model", None), "layers", []))
    if not layers:
        return [], 0
    attention, mlp = layers[0].self_attn, layers[0].mlp
    groups = ((attention.q_proj, attention.k_proj, attention.v_proj), (attention.o_proj,))
    groups += ((mlp.gate_proj, mlp.up_proj), (mlp.down_proj,))
    return [(sum(p.out_features for p in group), group[0].in_features) for group in groups], len(layers)


def torch_dtype() -> torch.dtype:
    """torch's kernels' activations here: bf16 where the CPU has it natively, else float32."""
    flags = cpu_flags() or frozenset()
    return torch.bfloat16 if any(flag in flags for flag in NATIVE_BF16) else torch.float32


def draft_group(shapes: list[tuple[int, int]]) -> int | None:
    """The int4 group a lower-precision fused layer of these shapes uses by default
    (`int_weights.common_group`)."""
    return common_group(inputs for _, inputs in shapes)


def _random(
    out: int, inputs: int, bits: int, group: int, generator: torch.Generator
) -> Int8Weight | Int4Weight:
    if bits == 8:
        q = torch.randint(-127, 128, (out, inputs), generator=generator, dtype=torch.int8)
        return Int8Weight(q, torch.rand(out, generator=generator) / 100)
    q = torch.randint(0, 16, (out, inputs), generator=generator, dtype=torch.uint8)
    pairs = (torch.rand(2, out, inputs // group, generator=generator) / 100).bfloat16().float()
    return Int4Weight(q, pairs[0].contiguous(), pairs[1].contiguous(), group)


def _calls(
    shapes: list[tuple[int, int]], layers: int, bits: int, rows: tuple[int, ...], dtype: torch.dtype
) -> dict[tuple[str, int], Callable[[], None]]:
    """A pass of each kernel over `layers` layers of `shapes` at each of `rows`, as one callable
    each (the buffers their calls point into kept by the callables). Each shape is quantized and
    packed once; every layer reads its own copy of those buffers (their values do not change the
    time, and copying is far cheaper than packing)."""
    generator = torch.Generator().manual_seed(bits)
    ours: dict[int, list[Callable[[], object]]] = {r: [] for r in rows}
    theirs: dict[int, list[Callable[[], object]]] = {r: [] for r in rows}
    kind = int_linear.INT8 if bits == 8 else int_linear.INT4
    function = next(iter(int_linear.builds(kind).values())).function
    group = draft_group(shapes) or GROUPS[0]
    kept: list[object] = []
    op8, op4 = torch.ops.aten._weight_int8pack_mm, torch.ops.aten._weight_int4pack_mm_for_cpu
    for out, inputs in shapes:
        quantized = _random(out, inputs, bits, group, generator)
        shape = torch.empty(out, inputs, device="meta")
        if bits == 8:
            mine = int_linear.Int8Linear(shape, None, quantized)
            other = int_torch.TorchInt8Linear(shape, None, quantized, dtype)
        else:
            mine = int_linear.Int4Linear(shape, None, quantized=quantized)
            other = int_torch.TorchInt4Linear(shape, None, quantized=quantized, dtype=dtype, keep=False)
        xs = {r: torch.randn(r, inputs, generator=generator) for r in rows}
        flats = {r: x.to(dtype) for r, x in xs.items()}
        y = torch.empty(max(rows), out)
        kept.append((xs, flats, y))
        for _ in range(layers):
            if bits == 8:
                packed, scale, q = mine.packed.clone(), mine.scale, other.q.clone()
                kept.append((packed, q))
                for r in rows:
                    args = (xs[r].data_ptr(), inputs, r, inputs, packed.data_ptr(), scale.data_ptr(), out)
                    ours[r].append(functools.partial(function, *args, None, y.data_ptr(), out))
                    theirs[r].append(functools.partial(op8, flats[r], q, other.scale))
            else:
                words, params = mine.words.clone(), mine.params.clone()
                packed, pairs = other.packed.clone(), other.scale_and_zeros.clone()
                kept.append((words, params, packed, pairs))
                for r in rows:
                    args = (
                        xs[r].data_ptr(),
                        inputs,
                        r,
                        inputs,
                        words.data_ptr(),
                        params.data_ptr(),
                        mine.group,
                    )
                    ours[r].append(functools.partial(function, *args, out, None, y.data_ptr(), out))
                    theirs[r].append(functools.partial(op4, flats[r], packed, other.group, pairs))

    def each(calls: list[Callable[[], object]]) -> Callable[[], None]:
        def run() -> None:
            for call in calls:
                call()

        run.kept = kept  # type: ignore[attr-defined]
        return run

    return {
        **{(f"int{bits} {OURS}", r): each(ours[r]) for r in rows},
        **{(f"int{bits} {TORCH}", r): each(theirs[r]) for r in rows},
    }


def measure(
    shapes: list[tuple[int, int]], layers: int, bits: tuple[int, ...] = BITS, dtype: torch.dtype | None = None
) -> dict[str, dict[str, float]]:
    """ms per pass of the products of `shapes` over `probed_layers` layers (each its own weights),
    per configuration (`"int8 ours"`, ...) and rows (module docstring)."""
    probed = probed_layers(shapes, layers)
    dtype = dtype or torch_dtype()
    timings: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        for b in bits:
            calls = _calls(shapes, probed, b, PROBE_ROWS, dtype)
            for call in calls.values():
                call()  # warm-up
            samples: dict[tuple[str, int], list[float]] = {cell: [] for cell in calls}
            cells = list(calls)
            for round_ in range(PROBE_ROUNDS):
                for cell in cells if round_ % 2 == 0 else cells[::-1]:
                    samples[cell].append(median_ms(calls[cell], PROBE_REPEATS))
            for (name, rows), values in samples.items():
                timings.setdefault(name, {})[str(rows)] = min(values)
    return timings


def probed_layers(shapes: list[tuple[int, int]], layers: int) -> int:
    """The layers a probe's pass reads: the model's, up to `PROBE_WEIGHTS` weights (at least one)."""
    return max(1, min(layers, PROBE_WEIGHTS // sum(out * inputs for out, inputs in shapes)))


def decide(timings: dict[str, dict[str, float]], bits: int) -> str:
    """`TORCH` where torch's pass is faster than ours by more than `TIE` at every probed row count."""
    ours, theirs = timings[f"int{bits} {OURS}"], timings[f"int{bits} {TORCH}"]
    return TORCH if all(theirs[rows] < ours[rows] * (1 - TIE) for rows in ours) else OURS


def _path(shapes: list[tuple[int, int]], layers: int, dtype: torch.dtype) -> Path:
    key = repr((sorted(shapes), probed_layers(shapes, layers), str(dtype)))
    return choice_path(f"int-products-{hashlib.sha256(key.encode()).hexdigest()[:12]}")


def choose_int_products(model: nn.Module) -> IntProductsChoice:
    """Which kernel runs `model`'s draft products at int8 and at int4 on this CPU (module
    docstring), measured once per machine and set of shapes and cached; ours without measuring
    where torch's kernels are missing, torch's where ours do not load or do not take the shapes
    (int4: one group size, of `GROUPS`, dividing every product's inputs)."""
    shapes, layers = draft_shapes(model)
    if not shapes:
        return IntProductsChoice({}, unavailable="no decoder layers to measure")
    group = draft_group(shapes)
    ours = {
        8: bool(int_linear.builds(int_linear.INT8)) and all(inputs % 8 == 0 for _, inputs in shapes),
        4: bool(int_linear.builds(int_linear.INT4)) and group is not None,
    }
    missing = int_torch.available()
    if missing is not None or not all(ours.values()):
        kernels = {f"int{b}": OURS if ours[b] else TORCH for b in BITS if ours[b] or missing is None}
        return IntProductsChoice(
            kernels, unavailable=missing or "our int kernels do not load or take these shapes"
        )
    dtype = torch_dtype()
    builds = "+".join(
        next(iter(int_linear.builds(kind).values())).build for kind in (int_linear.INT8, int_linear.INT4)
    )
    path = _path(shapes, layers, dtype)
    cached = read_choice(path, IntProductsChoice) or _UNKEPT.get(path)
    if (
        cached is not None
        and cached.kernel_builds == builds
        and set(cached.kernels.values()) <= set(KERNEL_NAMES)
    ):
        return cached
    timings = measure(shapes, layers, BITS, dtype)
    choice = IntProductsChoice(
        {f"int{bits}": decide(timings, bits) for bits in BITS},
        timings,
        str(dtype).removeprefix("torch."),
        builds,
    )
    if not keep_choice(path, choice, "the lower-precision products' kernels"):
        _UNKEPT[path] = choice
    return choice
