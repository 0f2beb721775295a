"""Building and loading the kernel plan's C kernels (`decode_attention*.c`, `linear_rows.c`): compiled
on first use with the system C compiler into the cache directory, loaded with ctypes
(docs/cpu-backend.md).

A kernel is built once per source, compiler version and compiler flags, and used only where the
CPU has the features it is written for and a compiler is found; otherwise `NativeLibrary.reason`
says why, the kernel plan prints it, and the plan keeps torch's kernels.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch  # noqa: F401  (loaded first: a kernel's libgomp.so.1 then resolves to torch's OpenMP runtime)

from skipsearch.cpu.dtypes import cpu_flags
from skipsearch.store import native_library_path


@dataclass(frozen=True)
class NativeLibrary:
    """A loaded kernel function, or None and the reason it is not there; `build` names the source,
    compiler and flags it was built from (a changed kernel is measured again); `handle` is the
    loaded library, for the other functions it exports."""

    function: ctypes._CFuncPtr | None
    reason: str
    build: str = ""
    handle: ctypes.CDLL | None = None


@dataclass(frozen=True)
class KernelSource:
    """A C source, the function it exports and that function's ctypes signature, the CPU flags
    it needs, the flags it is compiled with, and the headers beside it that it includes (part of
    its build: an edited header builds it again)."""

    path: Path
    symbol: str
    signature: Sequence[type]
    needed_flags: Sequence[str]
    compiler_flags: Sequence[str]
    headers: Sequence[Path] = ()


def compiler() -> str | None:
    """The C compiler: `$CC`, else `cc`, else `gcc`; None where none is on PATH."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def _build(source: KernelSource, compiler_path: str, target: Path) -> str | None:
    """Compile `source` into `target` (written whole or not at all); the compiler's complaint or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".{os.getpid()}.tmp")
    command = [compiler_path, *source.compiler_flags, "-o", str(partial), str(source.path)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        return (done.stderr.strip().splitlines() or ["failed"])[-1]
    partial.replace(target)
    return None


def load_native(source: KernelSource) -> NativeLibrary:
    """`source`'s function for this CPU, compiled once per source, compiler and compiler flags."""
    flags = cpu_flags() or frozenset()
    missing = [flag for flag in source.needed_flags if flag not in flags]
    if missing:
        return NativeLibrary(None, f"this CPU lacks {', '.join(missing)}")
    compiler_path = compiler()
    if compiler_path is None:
        return NativeLibrary(None, "no C compiler (cc or gcc) on PATH")
    version = subprocess.run([compiler_path, "--version"], capture_output=True, text=True, check=False).stdout
    code = source.path.read_bytes() + b"".join(header.read_bytes() for header in source.headers)
    digest = hashlib.sha256(code + version.encode() + " ".join(source.compiler_flags).encode())
    build = digest.hexdigest()[:16]
    target = native_library_path(source.path.stem, build)
    if not target.is_file():
        complaint = _build(source, compiler_path, target)
        if complaint is not None:
            return NativeLibrary(None, f"{Path(compiler_path).name} could not build it: {complaint}")
    handle = ctypes.CDLL(str(target))
    function = getattr(handle, source.symbol)
    function.restype, function.argtypes = ctypes.c_int, tuple(source.signature)
    reason = f"built by {Path(compiler_path).name} from {source.path.name}"
    return NativeLibrary(function, reason, build, handle)


def load_amx_native(source: KernelSource, ready: str) -> NativeLibrary:
    """`load_native` for a kernel on AMX tiles, whose library exports `ready` (`amx_tiles.h`):
    Linux lends a process the tile state only once asked, so where it does not, the reason."""
    library = load_native(source)
    if library.function is None:
        return library
    asked = getattr(library.handle, ready)
    asked.restype = ctypes.c_int
    if not asked():
        return NativeLibrary(None, "Linux did not lend this process the AMX tile state (arch_prctl)")
    return library
