"""The decode-attention kernel (`decode_attention.c`): built on first use, loaded with ctypes, and
called for the short query blocks of a decode (docs/theory.md, "The kernel plan").

A decode step, a draft step and a verify pass attend with a handful of queries to the whole
cache, so their attention should stream the K/V at the memory's bandwidth. torch's CPU SDPA does
not (10-16 GB/s over an fp32 cache against 39 GB/s for a copy on the project's EPYC, and bf16 is
slower still; results/kernels/attention_rows.md), and neither torch nor transformers ships another
CPU path for it. The C kernel reads a bf16 cache (which holds the bf16 projections' K/V exactly)
and does float32 arithmetic, so it computes the fp32 path's attention from half its bytes.

It is compiled with the system C compiler into the cache directory (one library per source,
compiler and compiler flags), and is used only where the CPU has the AVX-512 features it is
written for and a compiler is found; otherwise `load_kernel().reason` says why, the kernel plan
prints it, and the plan keeps torch's SDPA.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

from skipsearch.models.dtypes import cpu_flags
from skipsearch.store import native_library_path

SOURCE = Path(__file__).with_name("decode_attention.c")
NEEDED_FLAGS = ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16")
COMPILER_FLAGS = (
    "-O3", "-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl", "-mavx512bf16",
    "-fopenmp", "-shared", "-fPIC",
)  # fmt: skip
# Longer blocks (prefills, the estimator's teacher-forced passes) stay on SDPA, compute-bound there.
MAX_QUERIES = 16
_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
_SIGNATURE = (
    _POINTER, _INT, _INT, _POINTER, _POINTER, _INT, _POINTER, *[_INT] * 7, ctypes.c_float,
    _POINTER, _POINTER, _INT, _POINTER,
)  # fmt: skip


@dataclass(frozen=True)
class KernelLibrary:
    """The loaded kernel, or None and the reason it is not there; `build` names the source,
    compiler and flags it was built from (a changed kernel is measured again)."""

    function: ctypes._CFuncPtr | None
    reason: str
    build: str = ""


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _build(compiler: str, target: Path) -> str | None:
    """Compile `SOURCE` into `target` (written whole or not at all); the compiler's complaint or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    command = [compiler, *COMPILER_FLAGS, "-o", str(partial), str(SOURCE)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        return (done.stderr.strip().splitlines() or ["failed"])[-1]
    partial.replace(target)
    return None


@functools.cache
def load_kernel() -> KernelLibrary:
    """The kernel for this CPU, compiled once per source, compiler and compiler flags."""
    flags = cpu_flags() or frozenset()
    missing = [flag for flag in NEEDED_FLAGS if flag not in flags]
    if missing:
        return KernelLibrary(None, f"this CPU lacks {', '.join(missing)}")
    compiler = _compiler()
    if compiler is None:
        return KernelLibrary(None, "no C compiler (cc or gcc) on PATH")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    digest = hashlib.sha256(SOURCE.read_bytes() + version.encode() + " ".join(COMPILER_FLAGS).encode())
    build = digest.hexdigest()[:16]
    target = native_library_path(build)
    if not target.is_file():
        complaint = _build(compiler, target)
        if complaint is not None:
            return KernelLibrary(None, f"{Path(compiler).name} could not build it: {complaint}")
    # torch is imported above, so this library's libgomp.so.1 resolves to torch's OpenMP runtime
    function = ctypes.CDLL(str(target)).decode_attention
    function.restype, function.argtypes = ctypes.c_int, _SIGNATURE
    return KernelLibrary(function, f"built by {Path(compiler).name} from {SOURCE.name}", build)


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
    """Causal attention `[1, M, H, D]` (transformers' layout, bf16) of `query` `[1, H, M, D]` at the
    cache's last M positions over `key`/`value` `[1, KV, N, D]` (bf16, rows contiguous), keys
    restricted to `sink` + `window` where `window` > 0, plus the `extra` keys and values
    `[1, KV, P, D]` (contiguous) that every query sees (a draft's pillars); None where the kernel
    does not apply (not loaded, another dtype, a batch, a long block, or a layout it does not read).
    `scores` `[H, N]` (float32, contiguous, filled with -inf) receives query 0's scaled scores of
    the keys it sees."""
    function = load_kernel().function
    batch, heads, queries, dim = query.shape
    if (
        function is None
        or batch != 1
        or queries > MAX_QUERIES
        or not query.dtype == key.dtype == value.dtype == torch.bfloat16
        or query.stride(-1) != 1
        or any(t.stride(-1) != 1 or t.stride(-2) != dim or t.stride(1) != key.stride(1) for t in (key, value))
        or (extra is not None and not all(t.dtype == torch.bfloat16 and t.is_contiguous() for t in extra))
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
