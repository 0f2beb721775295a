"""Weights at int8 and int4 for lower-precision drafts: the quantizers, and the exact float32 values
they stand for (the issue "Drafts at lower precision"; the kernels are `cpu.int_linear`, torch's
own `cpu.int_torch`).

A decode step reads every weight once, so a draft that keeps every layer but reads each weight in
one byte (int8) or half a byte (int4) instead of bf16's two should cost about half or a quarter of
a step. The numerics, which every kernel here is tested against:

**int8, symmetric per output channel.** Row `o` of `weight` `[out, in]` has one float32 scale
`s[o] = max_k |w[o, k]| / 127` (1 where the row is all zeros) and int8 values
`q[o, k] = clamp(round_half_even(w[o, k] / s[o]), -127, 127)`. It stands for `q[o, k] * s[o]`
(`dequantize_int8`, one float32 rounding), within `s[o] / 2` of `w[o, k]`. -128 is never used,
so the range is symmetric. Because `s[o]` is one factor of the whole row, a kernel may apply it
once after summing `q * x` (the sums differ from the dequantized matrix's product only by the
reassociation of float32 arithmetic).

**int4, asymmetric in groups along the input.** Each row is cut into groups of `group` inputs (32,
64 or 128; `in` a multiple of it); group `g` of row `o` has a scale and a zero that are bf16 values
(held in float32 tensors): `s = bf16((max - min) / 15)`, `z = bf16(min + 8 s)` over the group's
weights (`s` = 1 where they are all equal), and values `q = clamp(round_half_even((w - z) / s) + 8,
0, 15)` that stand for `(q - 8) * s + z` computed in float32 (a product, then a sum, each rounded:
`dequantize_int4`). bf16 halves what the groups cost a step (4 bytes a group and row, not 8: at
groups of 128, 0.53 bytes a weight instead of 0.56) and is what torch's int4 kernel reads at its
fast (bf16) path, so the same quantized weights run on both kernels exactly:
`_weight_int4pack_mm_for_cpu`'s `qScaleAndZeros` hold `s` and `z`. A value stands within `s / 2` of
`w`, plus what rounding `s` and `z` to bf16 moves the grid (at most 2^-9 of `8 s + |z|`) and the
float32 roundings. Because `(q - 8) s + z = s q + (z - 8 s)`, a kernel may sum `q x` over a group and
apply the group once, `s sum(q x) + (z - 8 s) sum(x)` (the product reassociated, `z - 8 s` rounded
once), which is how ours reads them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

GROUPS = (32, 64, 128)  # the int4 group sizes the kernels take


@dataclass(frozen=True)
class Int8Weight:
    """`q` int8 `[out, in]` and `scale` float32 `[out]` (module docstring)."""

    q: torch.Tensor
    scale: torch.Tensor


@dataclass(frozen=True)
class Int4Weight:
    """`q` uint8 `[out, in]` with values 0..15 (one a byte: the kernels' layouts pack two), and
    `scale`, `zero` `[out, in / group]`, bf16 values in float32 tensors (module docstring)."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    group: int


def quantize_int8(weight: torch.Tensor) -> Int8Weight:
    """`weight` `[out, in]` (any float dtype) at int8, symmetric per output channel."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scale.contiguous())


def dequantize_int8(quantized: Int8Weight) -> torch.Tensor:
    """The float32 `[out, in]` matrix `quantized` stands for: `q * scale`, exactly as float32 rounds it."""
    return quantized.q.float() * quantized.scale[:, None]


def quantize_int4(weight: torch.Tensor, group: int = 128) -> Int4Weight:
    """`weight` `[out, in]` (any float dtype; `in` a multiple of `group`, one of `GROUPS`) at int4,
    asymmetric per group of `group` inputs."""
    if group not in GROUPS:
        raise ValueError(f"int4 groups are {', '.join(map(str, GROUPS))} inputs, not {group}")
    out, inputs = weight.shape
    if inputs % group:
        raise ValueError(f"{inputs} inputs are not a whole number of groups of {group}")
    w = weight.detach().float().reshape(out, inputs // group, group)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scale = ((high - low) / 15).bfloat16().float()
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = (low + 8 * scale).bfloat16().float()
    q = (torch.round((w - zero[..., None]) / scale[..., None]) + 8).clamp(0, 15).to(torch.uint8)
    return Int4Weight(q.reshape(out, inputs).contiguous(), scale.contiguous(), zero.contiguous(), group)


def common_group(inputs: Iterable[int], group: int | None = None) -> int | None:
    """The int4 group of matrices of these input widths quantized with one group size: `group`
    where it is one of `GROUPS` and divides every width, by default the smallest of `GROUPS` that
    does (the finest, as a draft's copies default to: it agrees with the full model most often);
    None where none does."""
    widths = list(inputs)
    sizes = (group,) if group is not None else GROUPS
    return next((size for size in sizes if size in GROUPS and all(n % size == 0 for n in widths)), None)


def dequantize_int4(quantized: Int4Weight) -> torch.Tensor:
    """The float32 `[out, in]` matrix `quantized` stands for: `(q - 8) * scale + zero`, a float32
    product then a float32 sum."""
    scale = quantized.scale.repeat_interleave(quantized.group, dim=1)
    zero = quantized.zero.repeat_interleave(quantized.group, dim=1)
    return (quantized.q.float() - 8) * scale + zero
