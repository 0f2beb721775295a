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
`_convert_weight_to_int4pack_for_cpu(Tensor self, int innerKTiles)`.) Both take float32
activations and accumulate in float32; their sums are ordered their own way, so their outputs agree
with the dequantized product within float32 tolerance, and whether a row's bits depend on the rows
beside it is theirs to say (not promised here).
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

INNER_K_TILES = 2  # the int4 packing's inner tiles (torch's tests use 2, 4, 8)
OUT_MULTIPLE = 16  # torch's int4 packing takes outputs in multiples of 16


def available() -> str | None:
    """Why torch's CPU weight-only kernels are missing from this build, or None."""
    for name in ("_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu", "_convert_weight_to_int4pack_for_cpu"):
        if not hasattr(torch.ops.aten, name):
            return f"torch {torch.__version__} has no aten.{name}"
    return None


class TorchInt8Linear(nn.Module):
    """`nn.Linear` at int8 weights on `aten._weight_int8pack_mm`."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, quantized: Int8Weight | None = None
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        quantized = quantized or quantize_int8(weight)
        self.q, self.scale = quantized.q.contiguous(), quantized.scale.float().contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_int8(Int8Weight(self.q, self.scale))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).float()
        y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*hidden.shape[:-1], self.out_features)

    def packed_bytes(self) -> int:
        return self.q.numel() + 4 * self.scale.numel()


class TorchInt4Linear(nn.Module):
    """`nn.Linear` at int4 weights in groups of `group` on `aten._weight_int4pack_mm_for_cpu`."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        group: int = 128,
        quantized: Int4Weight | None = None,
    ) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        quantized = quantized or quantize_int4(weight, group)
        self.quantized = quantized
        self.group = quantized.group
        padded = -(-self.out_features // OUT_MULTIPLE) * OUT_MULTIPLE
        q = torch.full((padded, self.in_features), 8, dtype=torch.int32)
        q[: self.out_features] = quantized.q.int()
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, INNER_K_TILES)
        pairs = torch.zeros(self.in_features // self.group, padded, 2)
        pairs[:, : self.out_features, 0] = quantized.scale.T
        pairs[:, : self.out_features, 1] = quantized.zero.T
        self.scale_and_zeros = pairs.contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_int4(self.quantized)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).float()
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scale_and_zeros)
        if y.shape[1] != self.out_features:
            y = y[:, : self.out_features]
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*hidden.shape[:-1], self.out_features)

    def packed_bytes(self) -> int:
        return self.packed.numel() * self.packed.element_size() + 4 * self.scale_and_zeros.numel()
