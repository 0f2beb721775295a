"""The decode-attention kernels (`decode_attention.c`, `decode_attention_fp32.c`): built on first use,
loaded with ctypes, and called for the short query blocks of a decode (docs/theory.md, "The kernel
plan").

A decode step, a draft step and a verify pass attend with a handful of queries to the whole
cache, so their attention should stream the K/V at the memory's bandwidth. torch's CPU SDPA does
not (10-16 GB/s over an fp32 cache against 39 GB/s for a copy on the project's AVX-512 EPYC, and
bf16 is slower still, results/kernels/attention_rows.md; a third of the copy bandwidth on a Zen 3
EPYC, results/profile/step_anatomy-smollm2-135m-float32-avx2.md), and neither torch nor
transformers ships another CPU path for it. The kernels, by cache dtype:
- bf16 (AVX-512 BF16): reads a bf16 cache, which holds the bf16 projections' K/V exactly, in
  float32 arithmetic, so it computes the fp32 path's attention from half its bytes;
- float32: the fp32 fallback plan's cache, whose K/V come from float32 activations, read in place;
  with AVX-512 by a second build of the bf16 kernel's source (its keys turned so that a score
  needs no horizontal sum), else by the AVX2 and FMA kernel.

Each build is built and loaded by `models.native`, used only where the CPU has the features it is
written for and a compiler is found; the widest that loads serves its dtype. Otherwise
`load_kernel(dtype).reason` says why, the kernel plan prints it, and the plan keeps torch's SDPA.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from skipsearch.models.native import KernelSource, NativeLibrary, load_native

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
_SIGNATURE = (
    _POINTER, _INT, _INT, _POINTER, _POINTER, _INT, _POINTER, *[_INT] * 7, ctypes.c_float,
    _POINTER, _POINTER, _INT, _POINTER,
)  # fmt: skip
_KEYS = Path(__file__).with_name("decode_attention_keys.h")  # which keys a block sees, for both
_LANES = Path(__file__).with_name("avx2_lanes.h")  # the fixed-order lane sums, shared with linear_rows.c
_EXP = Path(__file__).with_name("avx2_exp.h")  # e^x, shared with silu.c
_AVX512 = ("avx512f", "avx512bw", "avx512dq", "avx512vl")
_AVX512_FLAGS = ("-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-fopenmp", "-shared", "-fPIC")
# The builds over each cache dtype, the widest this CPU runs first: decode_attention.c is one
# source built for a bf16 cache and for a float32 one; decode_attention_fp32.c is the float32
# cache's kernel for CPUs without AVX-512.
SOURCES = {
    torch.bfloat16: (
        KernelSource(
            path=Path(__file__).with_name("decode_attention.c"),
            symbol="decode_attention",
            signature=_SIGNATURE,
            needed_flags=(*_AVX512, "avx512_bf16"),
            compiler_flags=(*_AVX512_FLAGS, "-mavx512bf16"),
            headers=(_KEYS,),
        ),
    ),
    torch.float32: (
        KernelSource(
            path=Path(__file__).with_name("decode_attention.c"),
            symbol="decode_attention_fp32",
            signature=_SIGNATURE,
            needed_flags=_AVX512,
            compiler_flags=(*_AVX512_FLAGS, "-DFLOAT32_CACHE"),
            headers=(_KEYS,),
        ),
        KernelSource(
            path=Path(__file__).with_name("decode_attention_fp32.c"),
            symbol="decode_attention_fp32",
            signature=_SIGNATURE,
            needed_flags=("avx2", "fma"),
            compiler_flags=("-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"),
            headers=(_KEYS, _LANES, _EXP),
        ),
    ),
}
# Longer blocks (prefills, the estimator's teacher-forced passes) stay on SDPA, compute-bound there.
MAX_QUERIES = 16


def _widest(dtype: torch.dtype) -> tuple[KernelSource, NativeLibrary]:
    for source in SOURCES[dtype]:
        library = load_native(source)
        if library.function is not None:
            return source, library
    return source, library


@functools.cache
def load_kernel(dtype: torch.dtype = torch.bfloat16) -> NativeLibrary:
    """The widest build of the kernel over a `dtype` cache that this CPU runs, compiled once per
    source, compiler and flags; where none loads, the narrowest's reason."""
    return _widest(dtype)[1]


@functools.cache
def kernel_source(dtype: torch.dtype = torch.bfloat16) -> KernelSource:
    """The build `load_kernel(dtype)` loads (or tried last)."""
    return _widest(dtype)[0]


def head_multiple(dtype: torch.dtype) -> int:
    """The head sizes the loaded kernel over a `dtype` cache reads are multiples of this (0 where
    none loads)."""
    library = load_kernel(dtype)
    if library.function is None:
        return 0
    multiple = library.handle.decode_attention_head_multiple
    multiple.restype = ctypes.c_int
    return int(multiple())


def decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    sink: int = 0,
    window: int = 0,
    extra: tuple[torch.Tensor, torch.Tensor] | None = None,
    scores: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Causal attention `[1, M, H, D]` (transformers' layout, in the cache's dtype) of `query`
    `[1, H, M, D]` at the cache's last M positions over `key`/`value` `[1, KV, N, D]` (bf16 or
    float32, the query's dtype; rows contiguous), keys
    restricted to `sink` + `window` where `window` > 0, plus the `extra` keys and values
    `[1, KV, P, D]` (contiguous) that every query sees (a draft's pillars); None where the kernel
    does not apply (not loaded, another dtype, a batch, a long block, or a layout it does not read).
    `scores` `[H, N]` (float32, contiguous, filled with -inf) receives query 0's scaled scores of
    the keys it sees."""
    function = load_kernel(query.dtype).function if query.dtype in SOURCES else None
    batch, heads, queries, dim = query.shape
    if (
        function is None
        or batch != 1
        or queries > MAX_QUERIES
        or not query.dtype == key.dtype == value.dtype
        or query.stride(-1) != 1
        or any(t.stride(-1) != 1 or t.stride(-2) != dim or t.stride(1) != key.stride(1) for t in (key, value))
        or (extra is not None and not all(t.dtype == query.dtype and t.is_contiguous() for t in extra))
        or (scores is not None and not (scores.dtype == torch.float32 and scores.is_contiguous()))
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
    )  # fmt: skip
    return None if failed else out
