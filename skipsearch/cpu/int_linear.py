"""int8 and int4 weights in float32 arithmetic: the lower-precision drafts' linear layers on our
own vector kernel, `linear_rows_int.c` (the issue "Drafts at lower precision"; the quantization is
`cpu.int_weights`', torch's kernels on the same weights are `cpu.int_torch`).

A draft step reads every weight once, so its floor is the weight bytes over the memory's
bandwidth: int8 reads half of bf16's bytes, int4 (with a bf16 scale and zero per group of 128)
0.27 of them. torch's weight-only kernels stream at 20-28 GB/s on a 2-core AVX-512 CPU where our bf16
kernel (`cpu.bf16_weights`, `linear_rows.c`) streams 35-40, so their int8 step costs 0.71-0.77 of
the bf16 one (and that with bf16 activations: with float32 ones they take a path 10-30x slower,
`cpu.int_torch`). This kernel is `linear_rows.c`'s design on the smaller weights: each weight read
once per call whatever the row count (1..`MAX_ROWS`), one sequential stream per block of
`OUT_BLOCK` outputs, each chunk widened to float32 once and multiplied into every row's float32
accumulators; every row's output is the same bits whatever the rows beside it (a verify's products
equal the draft steps').

Numerics (tested): int8, each output is `sum_k(q x) * scale + bias` in float32, the fp32 product
with `dequantize_int8`'s matrix up to the reassociation of its sums; int4, in both builds each
group enters as `scale * sum(q x) + (zero - 8 scale) * sum(x)` (the product with `dequantize_int4`'s
matrix reassociated, `zero - 8 scale` rounded once; a block's outputs are vector lanes, so a group's
scale and zero cost one vector operation for 16 or 8 outputs, `linear_rows_int.c` says why). The
tests hold every output within 1e-5 of the sum of its terms' magnitudes
(`|x| |w|`, int4 counting `|x| |zero|` too) from the float64 product with the dequantized matrix,
and every row's bits equal across 1..`MAX_ROWS` rows, in both builds. Blocks longer than
`MAX_ROWS` rows, other dtypes, or a CPU where no build loads, multiply the dequantized matrix with
torch's product.

These modules are the reference and the unfused path: a draft's decoder layers run the same kernels
inside the fused layers' C driver (`fused_layers.lower_precision_layer`, the modules' bits without
their ~6 us of Python a call); which kernel runs a draft's products on this CPU, ours or torch's,
is `cpu.int_choice`'s measurement. Nothing replaces a model's own layers with these modules.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from skipsearch.cpu.bf16_weights import MAX_ROWS
from skipsearch.cpu.int_weights import (
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)
from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
# x, x_stride, rows, in, w, scale, out, bias, y, y_stride
_SIGNATURE8 = (_POINTER, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _POINTER, _POINTER, _INT)
# x, x_stride, rows, in, w, params, group, out, bias, y, y_stride
_SIGNATURE4 = (_POINTER, _INT, _INT, _INT, _POINTER, _POINTER, _INT, _INT, _POINTER, _POINTER, _INT)
_COMPILE = ("-O3", "-mfma", "-ffp-contract=off", "-fopenmp", "-pthread", "-shared", "-fPIC")
_PATH = Path(__file__).with_name("linear_rows_int.c")
# shared_core.h: the products shared with busy cores (cpu.shared_core)
_HEADERS = (Path(__file__).with_name("avx2_lanes.h"), Path(__file__).with_name("shared_core.h"))
_BUILDS = (  # one source, two builds, the widest this CPU runs first (as linear_rows.c)
    (("avx512f", "avx2", "fma"), (*_COMPILE, "-mavx2", "-mavx512f")),
    (("avx2", "fma"), (*_COMPILE, "-mavx2")),
)
SOURCES8 = tuple(
    KernelSource(_PATH, "linear_rows_int8", _SIGNATURE8, needed, flags, _HEADERS) for needed, flags in _BUILDS
)
SOURCES4 = tuple(
    KernelSource(_PATH, "linear_rows_int4", _SIGNATURE4, needed, flags, _HEADERS) for needed, flags in _BUILDS
)
OUT_BLOCK = 4  # int8: weight rows the kernel streams together (linear_rows_int.c)
NIBBLES = 8  # int4 values a 32-bit word holds: 8 inputs of one output
INT4_VECTORS = 2  # int4: vectors of outputs a block streams together (linear_rows_int.c's OUT_VECTORS4)


INT8, INT4 = "int8", "int4"
_SOURCES = {INT8: SOURCES8, INT4: SOURCES4}


def lanes(library: NativeLibrary) -> int:
    """The inputs of one chunk of `library`'s layouts (8 where it did not load: the layouts are
    then only read back by the unpackers)."""
    if library.function is None:
        return 8
    function = library.handle.linear_rows_int_lanes
    function.restype = ctypes.c_int
    return int(function())


_LOADED: dict[str, NativeLibrary] = {}  # each build's library by its build, once loaded


@functools.cache
def builds(kind: str) -> dict[int, NativeLibrary]:
    """The builds of the `kind` (`INT8` or `INT4`) kernel this CPU runs, by their chunk width, the
    widest first."""
    loaded = (load_native(source) for source in _SOURCES[kind])
    found = {lanes(library): library for library in loaded if library.function is not None}
    _LOADED.update((library.build, library) for library in found.values())
    return found


def loaded_libraries() -> list[NativeLibrary]:
    """The int kernels' libraries loaded so far, one a build (int8 and int4 share one), without
    loading any: `cpu.shared_core` engages their helpers around a decode as it does the bf16 kernel's."""
    return list(_LOADED.values())


def _load(kind: str) -> NativeLibrary:
    found = builds(kind)
    return next(iter(found.values())) if found else load_native(_SOURCES[kind][-1])


def load_int8_kernel() -> NativeLibrary:
    """The widest build of the int8 kernel this CPU runs; where none loads, the narrowest's reason."""
    return _load(INT8)


def load_int4_kernel() -> NativeLibrary:
    """The widest build of the int4 kernel this CPU runs (the same library as the int8 one's)."""
    return _load(INT4)


def _width(kind: str, width: int | None) -> int:
    """The layout width a module packs for: `width`, else the widest build's (8 where none loads)."""
    return width or next(iter(builds(kind)), 8)


def fits(weight: torch.Tensor, group: int | None = None) -> bool:
    """Whether the kernels read this matrix: float on a CPU, inputs a multiple of 8 (int8) or of
    `group` (int4)."""
    inputs = weight.shape[1]
    return weight.device.type == "cpu" and weight.is_floating_point() and inputs % (group or 8) == 0


def pack_int8(q: torch.Tensor, width: int) -> torch.Tensor:
    """int8 `q` `[out, in]` in the kernel's layout `[blocks, in / width, OUT_BLOCK, width]`: each block
    of `OUT_BLOCK` output rows one contiguous stream, chunk by chunk of `width` inputs, a chunk the
    block's rows one after the other (zeros past `out` and past `in`, up to a multiple of `width`)."""
    out, inputs = q.shape
    padded = torch.zeros(-(-out // OUT_BLOCK) * OUT_BLOCK, -(-inputs // width) * width, dtype=torch.int8)
    padded[:out, :inputs] = q
    return padded.view(padded.shape[0] // OUT_BLOCK, OUT_BLOCK, -1, width).permute(0, 2, 1, 3).contiguous()


def unpack_int8(packed: torch.Tensor, out: int, inputs: int) -> torch.Tensor:
    """The int8 `[out, inputs]` values `packed` holds."""
    blocks, chunks, _, width = packed.shape
    return packed.permute(0, 2, 1, 3).reshape(blocks * OUT_BLOCK, chunks * width)[:out, :inputs]


def int4_block(width: int) -> int:
    """The outputs of one block of the int4 layout for the `width` build: `INT4_VECTORS` vectors."""
    return INT4_VECTORS * width


def pack_int4(quantized: Int4Weight, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantized`'s values and groups in the kernel's layouts, by blocks of `int4_block(width)`
    outputs, an output a vector lane (zeros past `out`). The values: int32 words `[blocks, in / 8,
    block]`, per block one contiguous stream, word `[b, w, lane]` holding in its nibble `j` (bits
    `4j..4j+3`) the value `q` of output `b block + lane`, input `8 w + j`. The groups: `(scale,
    zero)` pairs in bf16 `[blocks, in / group, block, 2]` (bf16 values, as
    `int_weights.quantize_int4` makes them: others are refused)."""
    q = quantized.q
    out, inputs = q.shape
    if inputs % NIBBLES:
        raise ValueError(f"int4 rows of {inputs} inputs are not whole 32-bit words of {NIBBLES}")
    block = int4_block(width)
    rows = -(-out // block) * block
    nibbles = torch.zeros(rows, inputs, dtype=torch.int64)
    nibbles[:out] = q.long()
    nibbles = nibbles.view(rows // block, block, inputs // NIBBLES, NIBBLES)  # block, lane, word, j
    shifts = (4 * torch.arange(NIBBLES, dtype=torch.int64)).view(1, 1, 1, NIBBLES)
    words = (nibbles << shifts).sum(dim=3).permute(0, 2, 1)  # block, word, lane (disjoint bits)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).contiguous()
    groups = inputs // quantized.group
    params = torch.zeros(rows, groups, 2, dtype=torch.bfloat16)
    params[:out, :, 0], params[:out, :, 1] = quantized.scale, quantized.zero
    if not (
        torch.equal(params[:out, :, 0].float(), quantized.scale)
        and torch.equal(params[:out, :, 1].float(), quantized.zero)
    ):
        raise ValueError(
            "the kernel reads int4 scales and zeros as bf16 values (int_weights.quantize_int4's)"
        )
    params = params.view(rows // block, block, groups, 2).permute(0, 2, 1, 3).contiguous()
    return words, params


def unpack_int4(
    words: torch.Tensor, params: torch.Tensor, out: int, inputs: int, group: int, width: int
) -> Int4Weight:
    """The `Int4Weight` `pack_int4(…, width)`'s layouts hold."""
    blocks, block = words.shape[0], int4_block(width)
    shifts = (4 * torch.arange(NIBBLES, dtype=torch.int64)).view(1, 1, 1, NIBBLES)
    flat = (words.long() & 0xFFFFFFFF).permute(0, 2, 1)  # block, lane, word
    nibbles = (flat[..., None] >> shifts) & 15  # block, lane, word, j
    q = nibbles.reshape(blocks * block, -1)[:out, :inputs].to(torch.uint8)
    pairs = params.permute(0, 2, 1, 3).reshape(blocks * block, -1, 2)[:out].float()
    return Int4Weight(q.contiguous(), pairs[..., 0].contiguous(), pairs[..., 1].contiguous(), group)


def _function(kind: str, width: int) -> ctypes._CFuncPtr | None:
    library = builds(kind).get(width)
    return None if library is None else library.function


def _output(hidden: torch.Tensor, out: int) -> torch.Tensor:
    return torch.empty((*hidden.shape[:-1], out))


class _IntLinear(nn.Module):
    """What `Int8Linear` and `Int4Linear` share: a float32 block of 1..`MAX_ROWS` rows runs the
    kernel (`_kernel`, over its packed weights, `_weights`); other blocks, other dtypes, or no
    kernel, multiply the dequantized matrix (`weight`) with torch."""

    kind: str  # the kernel it runs, INT8 or INT4: each subclass says

    def _kernel(self) -> ctypes._CFuncPtr | None:
        return _function(self.kind, self.width)

    def _weights(self) -> tuple[int, ...]:
        """The kernel's arguments between the inputs' and the outputs' (`_SIGNATURE8`, `_SIGNATURE4`)."""
        raise NotImplementedError

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        rows = hidden.numel() // self.in_features
        function = self._kernel()
        if function is None or not 1 <= rows <= MAX_ROWS or hidden.dtype is not torch.float32:
            bias = None if self.bias is None else self.bias.to(hidden.dtype)
            return F.linear(hidden, self.weight.to(hidden.dtype), bias)
        if not hidden.is_contiguous():
            hidden = hidden.contiguous()
        y = _output(hidden, self.out_features)
        failed = function(
            hidden.data_ptr(), self.in_features, rows, self.in_features, *self._weights(),
            self.out_features, None if self.bias is None else self.bias.data_ptr(), y.data_ptr(),
            self.out_features,
        )  # fmt: skip
        if failed:
            raise RuntimeError(f"linear_rows_{self.kind} refused a {rows}x{self.in_features} block")
        return y


class Int8Linear(_IntLinear):
    """`nn.Linear`'s product with the weight at int8 (`int_weights.quantize_int8`, or `quantized`
    given), in float32 arithmetic on `linear_rows_int.c`. `weight` is the float32 matrix it
    multiplies by (`dequantize_int8`), computed on each read."""

    kind = INT8

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quantized: Int8Weight | None = None,
        width: int | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.width = _width(INT8, width)  # the build it runs: 16 (AVX-512) or 8 (AVX2)
        quantized = quantized or quantize_int8(weight)
        self.packed = pack_int8(quantized.q, self.width)
        self.scale = quantized.scale.float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def quantized(self) -> Int8Weight:
        return Int8Weight(unpack_int8(self.packed, self.out_features, self.in_features), self.scale)

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_int8(self.quantized())

    def _kernel(self) -> ctypes._CFuncPtr | None:
        return super()._kernel() if self.in_features % 8 == 0 else None

    def _weights(self) -> tuple[int, ...]:
        return self.packed.data_ptr(), self.scale.data_ptr()

    def packed_bytes(self) -> int:
        """The bytes a call reads: the values and the scales."""
        return self.packed.numel() + 4 * self.scale.numel()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 weights"


class Int4Linear(_IntLinear):
    """`nn.Linear`'s product with the weight at int4 in groups of `group` inputs
    (`int_weights.quantize_int4`, or `quantized` given), in float32 arithmetic on
    `linear_rows_int.c`. `weight` is the float32 matrix it multiplies by (`dequantize_int4`; the
    kernel reassociates the product by group), computed on each read."""

    kind = INT4

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int = 128,
        quantized: Int4Weight | None = None,
        width: int | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.width = _width(INT4, width)  # the build it runs: 16 (AVX-512) or 8 (AVX2)
        quantized = quantized or quantize_int4(weight, group)
        self.group = quantized.group
        self.words, self.params = pack_int4(quantized, self.width)
        self.bias = None if bias is None else bias.detach().float().contiguous()

    def quantized(self) -> Int4Weight:
        return unpack_int4(
            self.words, self.params, self.out_features, self.in_features, self.group, self.width
        )

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_int4(self.quantized())

    def _weights(self) -> tuple[int, ...]:
        return self.words.data_ptr(), self.params.data_ptr(), self.group

    def packed_bytes(self) -> int:
        """The bytes a call reads: the values and the groups' scales and zeros."""
        return self.words.numel() * 4 + self.params.numel() * 2

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"int4 weights in groups of {self.group}"
        )
