"""Swapping a model's sub-modules for the kernel plan's own (`bf16_weights`, `packed`, `rms_norm`).

Each of the plan's steps replaces some children of a transformers model in place, wherever they
sit in its tree; this walks the tree once and does the replacing, so a step says only which
children it takes and what it puts in their place.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def replace_children(model: nn.Module, replacement: Callable[[nn.Module], nn.Module | None]) -> int:
    """Put `replacement(child)` in place of every child of every module of `model` for which it is
    not None (the tree as it was before any replacement); returns how many were replaced.

    Only the parents are listed up front: a replaced child is let go as soon as it is replaced, so
    a model's matrices are not held twice, old and new, until the last is replaced."""
    replaced = 0
    for parent in [module for module in model.modules() if next(module.children(), None) is not None]:
        for name, child in list(parent.named_children()):
            new = replacement(child)
            if new is not None:
                parent.add_module(name, new)
                replaced += 1
    return replaced
