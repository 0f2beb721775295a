"""Building the kernel plan's C kernels (`cpu.native`): a build is named by its source, the
headers it includes, the compiler and the flags, so an edited header is built again."""

import ctypes
from pathlib import Path

import pytest

from skipsearch.cpu import native
from skipsearch.cpu.native import KernelSource, load_native


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH")
def test_an_edited_header_builds_the_kernel_again(cache_in_tmp: Path, tmp_path: Path) -> None:
    header = tmp_path / "offset.h"
    source = tmp_path / "add.c"
    header.write_text("#define OFFSET 1\n")
    source.write_text('#include "offset.h"\nint add(int x) { return x + OFFSET; }\n')
    kernel = KernelSource(source, "add", (ctypes.c_int,), (), ("-O1", "-shared", "-fPIC"), (header,))
    first = load_native(kernel)
    assert first.function(41) == 42
    header.write_text("#define OFFSET 2\n")
    second = load_native(kernel)
    assert second.build != first.build and second.function(41) == 43
