"""torch's weight-only int8 and int4 kernels on `cpu.int_weights`' quantized weights: the baseline
our kernel (`cpu.int_linear`) is measured against, so that a plan can pick per CPU.

- int8: `aten._weight_int8pack_mm(x, q, scales)` (x `[m, in]` float32, q int8 `[out, in]`, scales
  float32 `[out]`): `x (q scale)^T`.
- int4: `aten._convert_weight_to_int4pack_for_cpu(q, innerKTiles)` packs int32 `[out, in]` values
  0..15 (`out` a multiple of 16: padded here) and `aten._weight_int4pack_mm_for_cpu(x, packed,
  group, qScaleAndZeros)` multiplies by `(q - 8) scale + zero`, `qScaleAndZeros` float32
  `[in / group, out, 2]`: `int_weights`' scheme, so the same quantized weights.

(Schemas in torch 2.13: `_weight_int8pack_mm(Tensor self, Tensor mat2, Tensor scales)`,
`_weight_int4pack_mm_for_cpu(Tensor self, Tensor mat2, int qGroupSize, Tensor qScaleAndZeros)`,
`_convert_weight_to_int4pack_for_cpu(Tensor self, int innerKTiles)`.)

The activations, scales and zeros are in the kernels' `dtype`, and only bf16 is fast: on this
project's Xeon (one thread, a 4864 x 896 matrix, one row) int8 ran at 12 G weights/s with bf16
activations and 1.2 with float32 (float16 0.6), int4 at 18.5 against 0.5. So the baseline's default
is bf16 (`DTYPE`): the input is rounded to bf16, the scales and zeros too (`weight` is the matrix it
then stands for), and the output comes back rounded to bf16, then widened to float32. float32 is
kept for an exact comparison. Their sums are ordered their own way; whether a row's bits depend on
the rows beside it is theirs to say (not promised here).
"""

from __future__ import annotations

import torch
from torch import nn

from skipsearch.cpu.int_weights import (
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)

DTYPE = torch.bfloat16  # the activations' dtype torch's kernels are fast for (module docstring)
INNER_K_TILES = 2  # the int4 packing's inner tiles (torch's tests use 2, 4, 8)
OUT_MULTIPLE = 16  # torch's int4 packing takes outputs in multiples of 16


def available() -> str | None:
    """Why torch's CPU weight-only kernels are missing from this build, or None."""
    for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu"):
        if not hasattr(torch.ops.aten, name):
            return f"torch {torch.__version__} has no aten.{name}"
    return None


class TorchInt8Linear(nn.Module):
    """`nn.Linear` at int8 weights on `aten._weight_int8pack_mm`, in `dtype` (the input, scales and
    output rounded to it; float32 out)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        quantized: Int8Weight | None = None,
        dtype: torch.dtype = DTYPE,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        quantized = quantized or quantize_int8(weight)
        self.q, self.scale = quantized.q.contiguous(), quantized.scale.to(dtype).contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix it multiplies by: `q` times the scales as rounded to `dtype`."""
        return dequantize_int8(Int8Weight(self.q, self.scale.float()))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).to(self.dtype)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*hidden.shape[:-1], self.out_features)

    def packed_bytes(self) -> int:
        return self.q.numel() + self.scale.numel() * self.scale.element_size()


class TorchInt4Linear(nn.Module):
    """`nn.Linear` at int4 weights in groups of `group` on `aten._weight_int4pack_mm_for_cpu`, in
    `dtype` (the input, scales, zeros and output rounded to it; float32 out). `keep` keeps the values
    for `weight` (a byte each: the tests' reference, not what a call reads)."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int = 128,
        quantized: Int4Weight | None = None,
        dtype: torch.dtype = DTYPE,
        keep: bool = True,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        quantized = quantized or quantize_int4(weight, group)
        rounded = (quantized.scale.to(dtype).float(), quantized.zero.to(dtype).float())
        self.quantized = Int4Weight(quantized.q, *rounded, quantized.group) if keep else None
        self.group = quantized.group
        padded = -(-self.out_features // OUT_MULTIPLE) * OUT_MULTIPLE
        q = torch.full((padded, self.in_features), 8, dtype=torch.int32)
        q[: self.out_features] = quantized.q.int()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INNER_K_TILES)
        pairs = torch.zeros(self.in_features // self.group, padded, 2)
        pairs[:, : self.out_features, 0] = quantized.scale.T
        pairs[:, : self.out_features, 1] = quantized.zero.T
        self.scale_and_zeros = pairs.to(dtype).contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        """The float32 matrix it multiplies by: `dequantize_int4` with the scales and zeros as
        rounded to `dtype` (only where built with `keep`)."""
        if self.quantized is None:
            raise ValueError("built without keep: the values are only in torch's packing")
        return dequantize_int4(self.quantized)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).to(self.dtype)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(
            flat, self.packed, self.group, self.scale_and_zeros
        ).float()
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*hidden.shape[:-1], self.out_features)

    def packed_bytes(self) -> int:
        pairs = self.scale_and_zeros
        return self.packed.numel() * self.packed.element_size() + pairs.numel() * pairs.element_size()
