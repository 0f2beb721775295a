"""The fallback plan's rotary position embedding in one kernel call a layer (`rotary.c`;
docs/cpu-backend.md).

transformers applies the rotary embedding with about fifteen torch operations a layer, each dispatch
a few microseconds on vectors of a few hundred floats: on an AVX2-only CPU that was 4.4 ms of
SmolLM2's 36 ms decode step (12%). The kernel computes the same formula with the same IEEE
operations in the same order, so its outputs are transformers' bits exactly (tested).

transformers' attention modules call the rotary function of their modeling module, and offer no
per-model hook for it, so `use_kernel_rotary` replaces that function in the modeling modules of the
supported families (`FAMILIES`), for the whole process. Since the outputs are the same bits, this
changes no result anywhere, only the time: inputs the kernel does not take (not float32, not on
the CPU, a batch, a head width not a multiple of 16, another `unsqueeze_dim`) run transformers' own
function.
"""

from __future__ import annotations

import ctypes
import functools
import importlib
from collections.abc import Callable
from pathlib import Path

import torch

from skipsearch.cpu.native import KernelSource, NativeLibrary, load_native

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64
SOURCE = KernelSource(
    path=Path(__file__).with_name("rotary.c"),
    symbol="rotary",
    # queries (data, heads, head stride, row stride, out, out head stride, out row stride), keys (the
    # same), rows, dim, cos, sin
    signature=(*(_POINTER, _INT, _INT, _INT, _POINTER, _INT, _INT) * 2, _INT, _INT, _POINTER, _POINTER),
    needed_flags=("avx2",),
    # No contraction into fused multiply-adds: the kernel's bits are transformers' only if every
    # product and sum is rounded on its own, as torch's separate operations round them.
    compiler_flags=("-O3", "-mavx2", "-ffp-contract=off", "-shared", "-fPIC"),
)
# The supported families' modeling modules: each applies `apply_rotary_pos_emb(q, k, cos, sin)`
# with transformers' `q * cos + rotate_half(q) * sin`.
FAMILIES = (
    "transformers.models.llama.modeling_llama",
    "transformers.models.mistral.modeling_mistral",
    "transformers.models.qwen2.modeling_qwen2",
)
ROTARY_FUNCTION = "apply_rotary_pos_emb"


@functools.cache
def load_kernel() -> NativeLibrary:
    """The kernel for this CPU, compiled once per source, compiler and compiler flags."""
    return load_native(SOURCE)


def _takes(tensor: torch.Tensor, dim: int) -> bool:
    """Whether the kernel reads `tensor` `[1, heads, rows, dim]` in place: float32 on the CPU, one
    sequence, each head's rows `dim` floats long and contiguous."""
    return (
        tensor.dtype is torch.float32
        and tensor.device.type == "cpu"
        and tensor.dim() == 4
        and tensor.shape[0] == 1
        and tensor.shape[3] == dim
        and tensor.stride(3) == 1
    )


def kernel_rotary(
    reference: Callable[..., tuple[torch.Tensor, torch.Tensor]],
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """transformers' rotary function `reference`, run by the kernel where it takes the inputs."""

    @functools.wraps(reference)
    def apply(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int = 1
    ) -> tuple[torch.Tensor, torch.Tensor]:
        function = load_kernel().function
        dim = q.shape[-1]
        rows = q.shape[2] if q.dim() == 4 else -1
        if (
            function is None
            or unsqueeze_dim != 1
            or dim % 16
            or not (_takes(q, dim) and _takes(k, dim) and k.shape[2] == rows)
            or cos.shape != (1, rows, dim)
            or sin.shape != cos.shape
            or not all(t.dtype is torch.float32 and t.is_contiguous() for t in (cos, sin))
        ):
            return reference(q, k, cos, sin, unsqueeze_dim)
        # empty_like keeps the inputs' strides, as torch's element-wise outputs do.
        q_out, k_out = torch.empty_like(q), torch.empty_like(k)
        function(
            q.data_ptr(), q.shape[1], q.stride(1), q.stride(2), q_out.data_ptr(), q.stride(1), q.stride(2),
            k.data_ptr(), k.shape[1], k.stride(1), k.stride(2), k_out.data_ptr(), k.stride(1), k.stride(2),
            rows, dim, cos.data_ptr(), sin.data_ptr(),
        )  # fmt: skip
        return q_out, k_out

    apply.reference = reference  # type: ignore[attr-defined]
    return apply


def runs_kernel_rotary(model: torch.nn.Module) -> bool:
    """Whether `model`'s attention applies the rotary embedding on the kernel: its modeling module's
    function is the kernel's (`use_kernel_rotary` ran in this process) and the kernel is built."""
    module = importlib.import_module(type(model).__module__)
    return hasattr(getattr(module, ROTARY_FUNCTION, None), "reference") and load_kernel().function is not None


def use_kernel_rotary() -> bool:
    """Run the supported families' rotary embedding on the kernel from now on, in this process
    (module docstring); whether the kernel is built for this CPU. Calling it again changes nothing."""
    if load_kernel().function is None:
        return False
    for name in FAMILIES:
        module = importlib.import_module(name)
        current = getattr(module, ROTARY_FUNCTION)
        if not hasattr(current, "reference"):
            setattr(module, ROTARY_FUNCTION, kernel_rotary(current))
    return True
