"""The names of the attention paths a model may run (registered with transformers by
`models.attention`), and the dtype of the K/V cache each reads (`kv_cache_dtype`).
"""

from __future__ import annotations

from typing import Any

import torch

NATIVE_ATTENTION = "sdpa_plan"  # transformers' SDPA, with KV patterns; registered below
FP32_ATTENTION = "sdpa_fp32kv"  # registered with transformers below
KERNEL_ATTENTION = "kernel_bf16kv"  # registered with transformers below
KERNEL_FP32_ATTENTION = "kernel_fp32kv"  # registered with transformers below
KERNEL_AMX_ATTENTION = "kernel_fp32kv_amx"  # registered with transformers below
# The decode kernels of float32 activations (the fused layers call either): the AVX2 one over a float32
# cache, the AMX one over a bf16 cache (it rounds the keys and values to bf16 as it multiplies them).
DECODE_KERNEL_FP32_PATHS = (KERNEL_FP32_ATTENTION, KERNEL_AMX_ATTENTION)
FP32_KV_PATHS = (FP32_ATTENTION, KERNEL_FP32_ATTENTION)  # the paths whose K/V cache is float32


def kv_cache_dtype(config: Any) -> torch.dtype | None:
    """The dtype the plan keeps K/V in: float32 beside the fp32 paths, bf16 for the AMX kernel (which
    rounds them to bf16 anyway: the same values in half the bytes), None for the projections' own."""
    path = getattr(config, "_attn_implementation", None)
    return (
        torch.float32 if path in FP32_KV_PATHS else torch.bfloat16 if path == KERNEL_AMX_ATTENTION else None
    )
