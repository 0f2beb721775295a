"""Which kernel multiplies a model's bf16 weights on a CPU with AMX: the vector kernel
(`linear_rows.c`) or the tile kernel (`linear_rows_amx.c`), measured on the model's own matrices
(docs/theory.md, "The kernel plan").

On the project's Xeon a verify of 4 drafts costs 1.3 steps, and the products' arithmetic is half of
what each extra position adds: the vector kernel does one FMA per weight and row. On AMX tiles the
extra rows are nearly free (a pass of every product of a step: 1.06x one row at 5 rows against
1.29-1.34x), but whether one row streams as fast depends on the matrices: as fast on Qwen2.5-0.5B's,
8% slower on SmolLM2's smaller ones (results/kernels/amx_products-*-amx.md). The autoregressive
baseline, which every speedup divides by, must run the fastest one-row kernel, and a verify must
run the decode steps' kernel (the same bits), so the tile kernel runs a model only where it is no
slower at one row and faster at `PROBE_ROWS[-1]` rows on that model's products, grouped as the
fused layers call them (q, k and v in one product, gate and up in one). It rounds the inputs to
bf16 as well, so the plan's numbers change with it, not only its speed; greedy SSD still equals
autoregressive decoding token for token, each row's bits being independent of the rows beside it.

The measurement is taken once per machine and set of matrix shapes, cached as the other choices
of the plan are (`kernels.keep_choice`: not kept while other processes keep a core busy).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from torch import nn

from skipsearch.models.bf16_weights import (
    TILES,
    VECTOR,
    fits,
    load_kernel,
    load_tile_kernel,
    multiply,
    pack_tiles,
    pack_weight,
)
from skipsearch.models.kernels import choice_path, keep_choice, median_ms, read_choice

PROBE_ROWS = (1, 4)  # a decode or draft step, and a verify of 3 drafts
PROBE_REPEATS = 5
KERNEL_NAMES = {VECTOR: "skipsearch's vector kernel", TILES: "skipsearch's AMX kernel"}
SHORT_NAMES = {VECTOR: "vector", TILES: "AMX"}
# (owner, projections) of a decoder layer's products as the fused layers call them
FUSED_GROUPS = (
    ("self_attn", ("q_proj", "k_proj", "v_proj")),
    ("self_attn", ("o_proj",)),
    ("mlp", ("gate_proj", "up_proj")),
    ("mlp", ("down_proj",)),
)

# Choices measured in this process but not kept (a busy machine), by path: one answer per process.
_UNKEPT: dict[Path, ProductsChoice] = {}


@dataclass(frozen=True)
class ProductsChoice:
    """The kernel a model's products run on (`VECTOR` or `TILES`), and the measurement: ms per pass
    of the model's products by kernel and row count; the builds measured (a changed kernel is
    measured again), or why the tile kernel could not be."""

    kernel: str
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    kernel_builds: str = ""
    unavailable: str = ""

    def describe(self) -> str:
        name = f"products on {KERNEL_NAMES[self.kernel]}"
        if not self.timings:
            return f"{name} (AMX kernel not used: {self.unavailable})" if self.unavailable else name
        cells = "; ".join(
            f"{SHORT_NAMES[kernel]} " + ", ".join(f"{ms:.2f}" for ms in by_rows.values())
            for kernel, by_rows in self.timings.items()
        )
        rows = "/".join(next(iter(self.timings.values())))
        return f"{name} (ms per pass of the model's products at {rows} rows: {cells})"


def _multiplied(module: object) -> bool:
    """Whether `use_bf16_weights` puts `module` on the products kernel."""
    return type(module) is nn.Linear and fits(module.weight)


def step_products(model: nn.Module) -> list[list[nn.Linear]]:
    """The linear layers a decode step multiplies on the kernel (`use_bf16_weights`' candidates):
    each decoder layer's grouped as the fused layers call them, then every other one (the LM head)
    alone."""
    groups: list[list[nn.Linear]] = []
    grouped: set[int] = set()
    for block in getattr(getattr(model, "model", None), "layers", []):
        for owner, names in FUSED_GROUPS:
            parts = [getattr(getattr(block, owner, None), name, None) for name in names]
            if all(_multiplied(part) for part in parts):
                groups.append(parts)
                grouped.update(id(part) for part in parts)
    singles = [[m] for m in model.modules() if _multiplied(m) and id(m) not in grouped]
    return groups + singles


def measure_products(groups: list[list[nn.Linear]]) -> dict[str, dict[str, float]]:
    """Median ms per pass of every product of `groups` (each group one matrix) on each kernel at each
    of `PROBE_ROWS`, the best of three interleaved medians."""
    weights = [torch.cat([part.weight for part in group]) for group in groups]
    functions = {VECTOR: load_kernel().function, TILES: load_tile_kernel().function}
    packed = {VECTOR: [pack_weight(w) for w in weights], TILES: [pack_tiles(w) for w in weights]}
    generator = torch.Generator().manual_seed(0)

    def one_pass(kernel: str, inputs: dict[int, torch.Tensor], rows: int) -> None:
        for weight, matrix in zip(weights, packed[kernel], strict=True):
            multiply(functions[kernel], inputs[weight.shape[1]], rows, matrix, weight.shape[0], None)

    timings: dict[str, dict[str, float]] = {VECTOR: {}, TILES: {}}
    widths = {weight.shape[1] for weight in weights}
    for rows in PROBE_ROWS:
        inputs = {width: torch.randn(1, rows, width, generator=generator) for width in widths}
        calls = {kernel: partial(one_pass, kernel, inputs, rows) for kernel in timings}
        for call in calls.values():
            call()  # warm-up
        rounds = [
            {kernel: median_ms(call, PROBE_REPEATS) for kernel, call in calls.items()} for _ in range(3)
        ]
        for kernel in calls:
            timings[kernel][str(rows)] = min(medians[kernel] for medians in rounds)
    return timings


def decide(timings: dict[str, dict[str, float]]) -> str:
    """`TILES` where the tile kernel is no slower at one row and faster at the most rows probed."""
    one, most = (str(PROBE_ROWS[0]), str(PROBE_ROWS[-1]))
    tiles, vector = timings[TILES], timings[VECTOR]
    return TILES if tiles[one] <= vector[one] and tiles[most] < vector[most] else VECTOR


def _path(groups: list[list[nn.Linear]]) -> Path:
    """One measurement per machine, torch version and set of product shapes."""
    shapes = sorted((group[0].in_features, sum(part.out_features for part in group)) for group in groups)
    return choice_path(f"products-{hashlib.sha256(repr(shapes).encode()).hexdigest()[:12]}")


def choose_products(model: nn.Module) -> ProductsChoice:
    """The kernel for the products of `model`'s linear layers (module docstring; before
    `use_bf16_weights` packs them for it), measured once per machine and set of shapes and cached;
    the vector kernel where the tile kernel does not load."""
    tiles, vector = load_tile_kernel(), load_kernel()
    groups = step_products(model)
    if tiles.function is None or vector.function is None or not groups:
        return ProductsChoice(VECTOR, unavailable=tiles.reason if tiles.function is None else vector.reason)
    builds = f"{vector.build}+{tiles.build}"
    path = _path(groups)
    cached = read_choice(path, ProductsChoice) or _UNKEPT.get(path)
    if cached is not None and cached.kernel in KERNEL_NAMES and cached.kernel_builds == builds:
        return cached
    timings = measure_products(groups)
    choice = ProductsChoice(decide(timings), timings, builds)
    if not keep_choice(path, choice, "the products' kernels"):
        _UNKEPT[path] = choice
    return choice
