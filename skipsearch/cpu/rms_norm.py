"""The fallback plan's RMSNorms in one kernel call each (`rms_norm.c`; docs/theory.md, "The kernel
plan").

transformers' RMSNorm is eight torch operations on a vector of a few hundred floats, and on an
AVX2-only CPU each dispatch costs 3-8 us while computing almost nothing: a SmolLM2 step runs 61
norms, 2-3 ms of a ~30 ms step whose weights take ~11 ms to read. The kernel computes the same
formula in one call, every row in a fixed order, so a row's norm is the same bits whatever the
rows beside it (a verify pass's norms equal the decode steps'). Inputs it does not take (not
float32, not on the CPU, not contiguous, a width not a multiple of 8) run transformers' own forward.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.mistral.modeling_mistral import MistralRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native
from skipsearch.cpu.replace import replace_children

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
SOURCE = KernelSource(
    path=Path(__file__).with_name("rms_norm.c"),
    symbol="rms_norm",
    signature=(_POINTER, _INT, _INT, _POINTER, ctypes.c_float, _POINTER),
    needed_flags=("avx2", "fma"),
    compiler_flags=("-O3", "-mavx2", "-mfma", "-shared", "-fPIC"),
    headers=(Path(__file__).with_name("avx2_lanes.h"),),
)
# The supported families' norms: each computes weight * (x * rsqrt(mean(x^2) + eps)), the kernel's formula.
SAME_FORMULA = (LlamaRMSNorm, MistralRMSNorm, Qwen2RMSNorm)


@functools.cache
def load_kernel() -> NativeLibrary:
    """The kernel for this CPU, compiled once per source, compiler and compiler flags."""
    return load_native(SOURCE)


class KernelRMSNorm(nn.Module):
    """A transformers RMSNorm (`SAME_FORMULA`) whose float32 CPU rows run on the kernel; it keeps
    the norm's weight (the same parameter) and, for everything else, the norm's own forward."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight
        self.variance_epsilon = float(norm.variance_epsilon)
        self.width = self.weight.numel()
        self.reference = type(norm).forward

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        function = load_kernel().function
        if (
            function is None
            or hidden.dtype is not torch.float32
            or self.weight.dtype is not torch.float32
            or hidden.device.type != "cpu"
            or not hidden.is_contiguous()
            or self.width % 8
        ):
            return self.reference(self, hidden)
        return self.on_kernel(function, hidden)

    def on_kernel(self, function: Callable[..., int], hidden: torch.Tensor) -> torch.Tensor:
        """The norm of `hidden` (float32, contiguous, on the CPU) by the kernel's `function`,
        unchecked: `forward` checks, and so do the fused layers (`cpu.fused_layers`) before they
        call it."""
        normed = torch.empty_like(hidden)
        function(
            hidden.data_ptr(), hidden.numel() // self.width, self.width, self.weight.data_ptr(),
            self.variance_epsilon, normed.data_ptr(),
        )  # fmt: skip
        return normed

    def extra_repr(self) -> str:
        return f"{self.width}, eps={self.variance_epsilon}, on the kernel"


def use_kernel_norms(model: nn.Module) -> int:
    """Replace every RMSNorm of `model` that computes the kernel's formula by a `KernelRMSNorm`;
    returns how many (0 where the kernel is not built for this CPU)."""
    if load_kernel().function is None:
        return 0
    return replace_children(
        model, lambda child: KernelRMSNorm(child) if type(child) in SAME_FORMULA else None
    )
