"""Swapping a model's sub-modules for the kernel plan's own (`bf16_weights`, `packed`, `rms_norm`).

Each of the plan's steps replaces some children of a transformers model in place, wherever they
sit in its tree; this walks the tree once and does the replacing, so a step says only which
children it takes and what it puts in their place.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

from torch import nn


def replace_children(model: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> int:
    """Put `replacement(child)` in place of every child of every module of `model` for which it is
    not None (the tree as it was before any replacement); returns how many were replaced.

    Only the parents are listed up front: a replaced child is let go as soon as it is replaced, and
    the memory of its weights goes back to the system then (`release_freed_memory`), so a model's
    matrices are not held twice, old and new, until the last is replaced."""
    replaced = 0
    for parent in [module for module in model.modules() if next(module.children(), None) is not None]:
        for name in [name for name, _ in parent.named_children()]:  # names only: each child let go
            child = parent.get_submodule(name)
            new = replacement(child)
            if new is not None:
                held_weights = next(child.parameters(), None) is not None
                parent.add_module(name, new)
                del child
                replaced += 1
                if held_weights:
                    release_freed_memory()
    return replaced


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    library = ctypes.CDLL(name) if name else None
    return getattr(library, "malloc_trim", None)  # glibc's; None elsewhere


def release_freed_memory() -> bool:
    """Hand the pages of freed memory back to the system (glibc's `malloc_trim`); False where the C
    library has no such call. glibc keeps freed blocks below its mmap threshold (up to 32 MB, a
    small model's whole matrix) in its heap for reuse: swapping Qwen2.5-0.5B's matrices for packed
    copies left 0.45 GB of them resident after the load, and a 7B's would add gigabytes."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
