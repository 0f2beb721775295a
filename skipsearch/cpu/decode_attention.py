"""The decode-attention kernels (`decode_attention.c`, `decode_attention_fp32.c`,
`decode_attention_amx.c`): built on first use, loaded with ctypes, and called for the short query
blocks of a decode (docs/cpu-backend.md).

A decode step, a draft step and a verify pass attend with a handful of queries to the whole cache,
so their attention should stream the K/V at the memory's bandwidth. torch's CPU SDPA does not (10-16
GB/s over an fp32 cache against 39 GB/s for a copy on a CPU with AVX-512 BF16, and bf16 is slower
still; a third of the copy bandwidth on a CPU with AVX2 only: docs/cpu-backend.md, "Decode
attention"), and neither torch nor transformers ships another CPU path for it. One kernel per cache
dtype, and a second for float32:
- bf16 (AVX-512 BF16): reads a bf16 cache, which holds the bf16 projections' K/V exactly, in
  float32 arithmetic, so it computes the fp32 path's attention from half its bytes;
- float32 (AVX2 and FMA): the fp32 fallback plan's cache, whose K/V come from float32 activations,
  read in place;
- float32 activations on AMX tiles: float32 queries over a bf16 cache (it rounds the queries, keys,
  values and softmax weights it multiplies to bf16, so the cache holds the keys and values it would
  multiply, in half the bytes), and a verify's extra rows nearly free.

Each is built and loaded by `cpu.native`, used only where the CPU has the features it is
written for and a compiler is found; otherwise `load_kernel(dtype).reason` says why, the kernel
plan prints it, and the plan keeps torch's SDPA.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from skipsearch.cpu.native import KernelSource, NativeLibrary, load_amx_native, load_native

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
_SIGNATURE = (
    _POINTER, _INT, _INT, _POINTER, _POINTER, _INT, _POINTER, *[_INT] * 7, ctypes.c_float,
    _POINTER, _POINTER, _INT, _POINTER, _POINTER, _INT,
)  # fmt: skip
_KEYS = Path(__file__).with_name("decode_attention_keys.h")  # which keys a block sees, for both
_LANES = Path(__file__).with_name("avx2_lanes.h")  # the fixed-order lane sums, shared with linear_rows.c
_EXP = Path(__file__).with_name("avx2_exp.h")  # e^x, shared with silu.c
_EXP_512 = Path(__file__).with_name("avx512_exp.h")  # e^x on 16 lanes, for the bf16 and AMX kernels
_TRANSPOSE = Path(__file__).with_name("avx512_transpose.h")  # for the bf16 and AMX kernels
_MERGE = Path(__file__).with_name("decode_attention_merge.h")  # the chunks' merge, fp32 and AMX kernels
_BF16_FLAGS = (
    "-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16",
    "-fopenmp", "-shared", "-fPIC",
)  # fmt: skip
SOURCES = {
    torch.bfloat16: KernelSource(
        path=Path(__file__).with_name("decode_attention.c"),
        symbol="decode_attention",
        signature=_SIGNATURE,
        needed_flags=("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"),
        compiler_flags=_BF16_FLAGS,
        headers=(_KEYS, _EXP_512, _TRANSPOSE),
    ),
    torch.float32: KernelSource(
        path=Path(__file__).with_name("decode_attention_fp32.c"),
        symbol="decode_attention_fp32",
        signature=_SIGNATURE,
        needed_flags=("avx2", "fma"),
        compiler_flags=("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"),
        headers=(_KEYS, _MERGE, _LANES, _EXP),
    ),
}
# The AMX kernel of float32 activations over a bf16 cache (decode_attention_amx.c): its rows cost about
# what one row costs, rounding to bf16 what it multiplies; `cpu.attention_choice` weighs it against
# the AVX2 one.
AMX_SOURCE = KernelSource(
    path=Path(__file__).with_name("decode_attention_amx.c"),
    symbol="decode_attention_amx",
    signature=_SIGNATURE,
    needed_flags=("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl"),
    compiler_flags=(*_BF16_FLAGS[:-3], "-mamx-tile", "-mamx-bf16", *_BF16_FLAGS[-3:]),
    headers=(_KEYS, _MERGE, _EXP_512, _TRANSPOSE, Path(__file__).with_name("amx_tiles.h")),
)
# Longer blocks (prefills, the estimator's teacher-forced passes) stay on SDPA, compute-bound there.
MAX_QUERIES = 16


@functools.cache
def load_kernel(dtype: torch.dtype = torch.bfloat16) -> NativeLibrary:
    """The kernel over a `dtype` cache for this CPU, compiled once per source, compiler and flags."""
    return load_native(SOURCES[dtype])


@functools.cache
def load_amx_kernel() -> NativeLibrary:
    """The AMX kernel (float32 queries, a bf16 cache), compiled once per source, compiler and flags;
    where it does not load, or Linux does not lend this process the tile state, the reason."""
    return load_amx_native(AMX_SOURCE, "decode_attention_amx_ready")


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sink: int = 0,
    window: int = 0,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
    scores: torch.Tensor | None = None,
    amx: bool = False,
    tree: tuple[torch.Tensor, int] | None = None,
) -> torch.Tensor | None:
    """Causal attention `[1, M, H, D]` (transformers' layout, in the cache's dtype) of `query`
    `[1, H, M, D]` at the cache's last M positions over `key`/`value` `[1, KV, N, D]` (bf16 or
    float32, the query's dtype; rows contiguous), keys
    restricted to `sink` + `window` where `window` > 0, plus the `extra` keys and values
    `[1, KV, P, D]` (contiguous) that every query sees (a draft's pillars); None where the kernel
    does not apply (not loaded, another dtype, a batch, a long block, or a layout it does not read).
    `scores` `[H, N]` (float32, contiguous, filled with -inf) receives query 0's scaled scores of
    the keys it sees. `amx`: float32 queries over a bf16 cache (and pillars) on the AMX kernel.
    `tree`: a token tree's rows, `(bits, base)` (`kv.tree_keys.TreeKeys`: int32 `[M]`, contiguous),
    which only the float32 kernel reads: query i sees the keys before `base` and key `base + j`
    where bit j of its pattern is set, at position `base` + its depth."""
    cache = torch.bfloat16 if amx else query.dtype  # the AMX kernel: float32 queries, a bf16 cache
    if amx:
        function = load_amx_kernel().function if query.dtype == torch.float32 else None
    else:
        function = load_kernel(query.dtype).function if query.dtype in SOURCES else None
    batch, heads, queries, dim = query.shape
    if (
        function is None
        or batch != 1
        or queries > MAX_QUERIES
        or not cache == key.dtype == value.dtype
        or query.stride(-1) != 1
        or any(t.stride(-1) != 1 or t.stride(-2) != dim or t.stride(1) != key.stride(1) for t in (key, value))
        or (extra is not None and not all(t.dtype == cache and t.is_contiguous() for t in extra))
        or (scores is not None and not (scores.dtype == torch.float32 and scores.is_contiguous()))
        or (tree is not None and not (tree[0].dtype == torch.int32 and tree[0].is_contiguous()))
        or (tree is not None and (amx or tree[0].shape != (queries,)))
    ):
        return None
    out = query.new_empty((1, queries, heads, dim))
    extra_keys, extra_values = extra if extra is not None else (None, None)
    failed = function(
        query.data_ptr(), query.stride(1), query.stride(2), key.data_ptr(), value.data_ptr(), key.stride(1),
        out.data_ptr(), heads, key.shape[1], queries, dim, key.shape[2], sink, window, scale,
        None if extra_keys is None else extra_keys.data_ptr(),
        None if extra_values is None else extra_values.data_ptr(),
        0 if extra_keys is None else extra_keys.shape[2],
        None if scores is None else scores.data_ptr(),
        None if tree is None else tree[0].data_ptr(), 0 if tree is None else tree[1],
    )  # fmt: skip
    return None if failed else out
