"""bf16 weights in float32 arithmetic: the linear layers of the fallback plan on a CPU without
native bf16, run by the `linear_rows.c` kernel (docs/cpu-backend.md).

A decode step reads every weight once, so its floor is the weight bytes over the memory's bandwidth,
and a verify of a few positions should cost what one step costs. On an AVX2-only CPU, torch's fp32
products are far from both: MKL streams the weights at 4-11 GB/s and pays about one more product per
extra row, and oneDNN's packed products halve that but keep the slope (docs/cpu-backend.md, "bf16
weights in float32 arithmetic"). The kernel reads each weight once per call whatever the number of
rows, from a bf16 copy in a blocked layout (one sequential stream per block of outputs, half the
bytes of fp32), widens it exactly to float32 and multiplies in float32.

So the weights are the bf16 plan's (the values a CPU with native bf16 runs), the activations,
K/V and attention stay float32, and every output row comes out of the same operations whatever
the row count: a verify pass's products equal the decode steps' bit for bit. Blocks longer than
`MAX_ROWS` (prefills, the estimator's teacher-forced passes) are compute-bound, not
memory-bound: on this kernel they multiply a float32 copy of the same rounded weights with
torch's product.

A CPU with AMX-BF16 has a second kernel for the same products, `linear_rows_amx.c` (`TILES`): tile
products, whose extra rows are nearly free where the vector kernel's (`VECTOR`) cost FMAs, at the
price of rounding each input row to bf16 too. It reads its own layout (`pack_tiles`), and a
module's `kernel` names which of the two it runs; which one a model runs is measured on its own
matrices (`cpu.products_choice`). It multiplies long blocks too, 16 rows at a time: a
16-row tile product costs about what a one-row one does, and a prefill then computes each
position's products with the same bits a decode step would.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from skipsearch.cpu.native import KernelSource, NativeLibrary, load_amx_native, load_native
from skipsearch.cpu.replace import replace_children

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
_SIGNATURE = (_POINTER, _INT, _INT, _INT, _POINTER, _INT, _POINTER, _POINTER, _INT)
_COMPILE = ("-O3", "-mfma", "-fopenmp", "-pthread", "-shared", "-fPIC")
_SHARED = Path(__file__).with_name("shared_core.h")  # products shared with busy cores (cpu.shared_core)
_HEADERS = (Path(__file__).with_name("avx2_lanes.h"), _SHARED)
# One source, two builds, the widest this CPU runs first: 16-float vectors with AVX-512, else 8.
SOURCES = (
    KernelSource(
        path=Path(__file__).with_name("linear_rows.c"),
        symbol="linear_rows",
        signature=_SIGNATURE,
        needed_flags=("avx512f", "avx2", "fma"),
        compiler_flags=(*_COMPILE, "-mavx2", "-mavx512f"),
        headers=_HEADERS,
    ),
    KernelSource(
        path=Path(__file__).with_name("linear_rows.c"),
        symbol="linear_rows",
        signature=_SIGNATURE,
        needed_flags=("avx2", "fma"),
        compiler_flags=(*_COMPILE, "-mavx2"),
        headers=_HEADERS,
    ),
)
OUT_BLOCK = 2  # weight rows the kernel streams together, in pairs (linear_rows.c)
INPUT_MULTIPLE = 8  # a matrix's inputs must be a multiple of this for the kernel (`fits`)
MAX_ROWS = 16  # a kernel call's most rows; longer: the tiles in calls of 16, else torch's product
TILE_SOURCE = KernelSource(
    path=Path(__file__).with_name("linear_rows_amx.c"),
    symbol="linear_rows",
    signature=_SIGNATURE,
    needed_flags=("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl"),
    compiler_flags=(
        "-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mamx-tile", "-mamx-bf16",
        "-fopenmp", "-pthread", "-shared", "-fPIC",
    ),
    headers=(Path(__file__).with_name("amx_tiles.h"), _SHARED),
)  # fmt: skip
TILE_OUT, TILE_IN, TILE_UNIT = 16, 32, 2  # a tile column's outputs, a tile product's inputs, columns a unit
VECTOR, TILES = "vector", "tiles"  # the two kernels (`Bf16WeightLinear.kernel`)
KERNELS = (VECTOR, TILES)


@functools.cache
def _widest() -> tuple[KernelSource, NativeLibrary]:
    for source in SOURCES:
        library = load_native(source)
        if library.function is not None:
            return source, library
    return source, library


def load_kernel() -> NativeLibrary:
    """The widest build of the kernel this CPU runs, compiled once per source, compiler and
    compiler flags; where none loads, the narrowest's reason."""
    return _widest()[1]


def kernel_source() -> KernelSource:
    """The build `load_kernel` loads (or tried last)."""
    return _widest()[0]


@functools.cache
def chunk() -> int:
    """The inputs of one chunk of the packed layout: the loaded build's vector width in floats
    (8 where no build loads: the layout is then only read back by `unpack_weight`)."""
    library = load_kernel()
    if library.function is None:
        return 8
    lanes = library.handle.linear_rows_lanes
    lanes.restype = ctypes.c_int
    return int(lanes())


@functools.cache
def load_tile_kernel() -> NativeLibrary:
    """The AMX kernel, compiled once per source, compiler and compiler flags; where it does not
    load, or Linux does not lend this process the tile state, the reason."""
    return load_amx_native(TILE_SOURCE, "linear_rows_amx_ready")


def kernel_library(kernel: str) -> NativeLibrary:
    """The library of the kernel `kernel` names (`VECTOR` or `TILES`)."""
    return load_kernel() if kernel == VECTOR else load_tile_kernel()


def out_block(kernel: str) -> int:
    """The outputs `kernel`'s layout packs together: a fused projection's parts must be multiples."""
    return OUT_BLOCK if kernel == VECTOR else TILE_OUT * TILE_UNIT


def fits(weight: torch.Tensor) -> bool:
    """Whether the kernel reads this matrix: float32, or already rounded to bf16 (loaded in the
    plan's layout, `models.weight_layout`), on a CPU, inputs a multiple of `INPUT_MULTIPLE`."""
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and weight.shape[1] % INPUT_MULTIPLE == 0
    )


def pack_weight(weight: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """`weight` `[out, in]` rounded to bf16 in the kernel's blocked layout `[blocks, in / c, c, 2]`
    (`c` = `chunk()`): each block of `OUT_BLOCK` output rows is one contiguous stream, chunk by
    chunk of `c` inputs, and a chunk holds its two rows' values in pairs (row 0's, row 1's at each
    input), so one vector load is split into both rows' float32 vectors by a shift and a mask (rows
    past `out` and inputs past `in`, up to a multiple of `c`, are zeros)."""
    out, inputs = weight.shape
    width = width or chunk()
    padded = torch.zeros(-(-out // OUT_BLOCK) * OUT_BLOCK, -(-inputs // width) * width, dtype=torch.bfloat16)
    padded[:out, :inputs] = weight
    return padded.view(padded.shape[0] // OUT_BLOCK, OUT_BLOCK, -1, width).permute(0, 2, 3, 1).contiguous()


def unpack_weight(packed: torch.Tensor, out: int, inputs: int) -> torch.Tensor:
    """The float32 `[out, inputs]` matrix `packed` holds (the rounded weights, exactly)."""
    blocks, chunks, width = packed.shape[:3]
    return packed.permute(0, 3, 1, 2).reshape(blocks * OUT_BLOCK, chunks * width)[:out, :inputs].float()


def pack_tiles(weight: torch.Tensor) -> torch.Tensor:
    """`weight` `[out, in]` rounded to bf16 in the AMX kernel's layout `[units, chunks, TILE_UNIT,
    TILE_IN / 2, TILE_OUT, 2]`: each unit of `TILE_UNIT` tile columns (`TILE_OUT` outputs each) is one
    contiguous stream, chunk by chunk of `TILE_IN` inputs, and a chunk holds each column's tile with
    the two values of an input pair side by side, as the tile product reads them (outputs past `out`
    and inputs past `in`, up to whole units and chunks, are zeros)."""
    out, inputs = weight.shape
    unit = TILE_OUT * TILE_UNIT
    padded = torch.zeros(-(-out // unit) * unit, -(-inputs // TILE_IN) * TILE_IN, dtype=torch.bfloat16)
    padded[:out, :inputs] = weight
    shape = (padded.shape[0] // unit, TILE_UNIT, TILE_OUT, padded.shape[1] // TILE_IN, TILE_IN // 2, 2)
    return padded.view(shape).permute(0, 3, 1, 4, 2, 5).contiguous()


def unpack_tiles(packed: torch.Tensor, out: int, inputs: int) -> torch.Tensor:
    """The float32 `[out, inputs]` matrix `packed` (`pack_tiles`' layout) holds."""
    units, chunks = packed.shape[:2]
    matrix = packed.permute(0, 2, 4, 1, 3, 5).reshape(units * TILE_UNIT * TILE_OUT, chunks * TILE_IN)
    return matrix[:out, :inputs].float()


def multiply(
    function: Callable[..., int],
    hidden: torch.Tensor,
    rows: int,
    packed: torch.Tensor,
    out: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`hidden` `[..., in]` (float32, contiguous, `rows` rows) times the `out` weight rows of
    `packed` (the layout `function`'s kernel reads), plus `bias`: `[..., out]`, by the kernel's
    `function`, in blocks of up to `MAX_ROWS` rows (each row's bits are the same in any block)."""
    inputs = hidden.shape[-1]
    y = torch.empty((*hidden.shape[:-1], out))
    for start in range(0, rows, MAX_ROWS):
        block = min(MAX_ROWS, rows - start)
        failed = function(
            hidden.data_ptr() + 4 * start * inputs, inputs, block, inputs, packed.data_ptr(), out,
            None if bias is None else bias.data_ptr(), y.data_ptr() + 4 * start * out, out,
        )  # fmt: skip
        if failed:
            raise RuntimeError(f"linear_rows refused a {block}x{inputs} block")
    return y


class Bf16WeightLinear(nn.Module):
    """`nn.Linear`'s product with the weight rounded to bf16, in float32 arithmetic, on the kernel
    `kernel` names (`VECTOR`, or `TILES`, which rounds the inputs to bf16 too).

    `weight` is the float32 matrix the product multiplies by (the rounded weights), unpacked on
    each read: read it once, not per step.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: str = VECTOR) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        self.packed = (pack_weight if kernel == VECTOR else pack_tiles)(weight.detach())
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        unpack = unpack_weight if self.kernel == VECTOR else unpack_tiles
        return unpack(self.packed, self.out_features, self.in_features)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # A decode step makes ~200 of these calls on a few hundred floats each: every torch
        # operation here costs a dispatch of a few microseconds, so the fast path makes one (the
        # output's allocation) besides the kernel call.
        rows = hidden.numel() // self.in_features
        function = kernel_library(self.kernel).function
        # Long blocks: the tiles multiply 16 rows at the price of one, in blocks of 16 (each row
        # the same bits as in a step); the vector kernel's would cost a product per row, so torch's.
        longest = rows if self.kernel == TILES else MAX_ROWS
        if function is None or not 1 <= rows <= longest or hidden.dtype is not torch.float32:
            bias = None if self.bias is None else self.bias.to(hidden.dtype)
            return F.linear(hidden, self.weight.to(hidden.dtype), bias)
        if not hidden.is_contiguous():
            hidden = hidden.contiguous()
        return multiply(function, hidden, rows, self.packed, self.out_features, self.bias)

    def packed_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size()

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bf16 weights ({self.kernel})"
        )


def use_bf16_weights(model: nn.Module, kernel: str = VECTOR) -> int:
    """Replace every `nn.Linear` of `model` that the kernel reads (`fits`) by a `Bf16WeightLinear`
    on `kernel`; returns how many. A head tied to the input embedding gets its own packed copy; the
    lookup keeps reading the embedding."""
    return replace_children(
        model,
        lambda child: (
            Bf16WeightLinear(child.weight, child.bias, kernel)
            if type(child) is nn.Linear and fits(child.weight)
            else None
        ),
    )
