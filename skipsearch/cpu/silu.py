"""The fallback plan's SiLU on a kernel (`silu.c`; docs/cpu-backend.md), in both of
a layer's paths.

The fused decoder layers run an MLP sub-layer in one C call (`cpu.fused_layers`), so their
activation cannot be torch's; the modules' path (prefills, teacher-forced passes, HF `generate`)
must compute the same bits, or a verify over the fused path and a prefill over the modules would
be two numerical plans. So every SiLU of a model on the plan runs this kernel, a few ulp from
torch's. Inputs it does not take (not float32, not on the CPU) run torch's.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import SiLUActivation

from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native
from skipsearch.cpu.replace import replace_children

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
SOURCE = KernelSource(
    path=Path(__file__).with_name("silu.c"),
    symbol="silu",
    signature=(_POINTER, _INT, _INT, _INT, _POINTER, _INT),  # x, rows, n, x row stride, y, y row stride
    needed_flags=("avx2", "fma"),
    # Products and sums rounded one by one, as the C driver's own (decoder_layer.c) are.
    compiler_flags=("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-shared", "-fPIC"),
    headers=(Path(__file__).with_name("avx2_exp.h"),),
)
SILUS = (SiLUActivation, nn.SiLU)


@functools.cache
def load_kernel() -> NativeLibrary:
    """The kernel for this CPU, compiled once per source, compiler and compiler flags."""
    return load_native(SOURCE)


class KernelSiLU(nn.Module):
    """SiLU whose float32 CPU inputs run on the kernel (module docstring)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        function = load_kernel().function
        if function is None or hidden.dtype is not torch.float32 or hidden.device.type != "cpu":
            return F.silu(hidden)
        hidden = hidden.contiguous()
        out = torch.empty_like(hidden)
        n = hidden.shape[-1] if hidden.dim() else 1
        function(hidden.data_ptr(), hidden.numel() // max(n, 1), n, n, out.data_ptr(), n)
        return out

    def extra_repr(self) -> str:
        return "on the kernel"


def use_kernel_silu(model: nn.Module) -> int:
    """Replace every SiLU of `model` by a `KernelSiLU`; returns how many (0 where the kernel is not
    built for this CPU)."""
    if load_kernel().function is None:
        return 0
    return replace_children(model, lambda child: KernelSiLU() if type(child) in SILUS else None)
