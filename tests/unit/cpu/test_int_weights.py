"""Weights at int8 and int4 (`cpu.int_weights`): the quantizers' bounds and the exact values they
stand for, and torch's weight-only kernels (`cpu.int_torch`) multiplying by those values."""

from __future__ import annotations

import pytest
import torch

from skipsearch.cpu import int_torch
from skipsearch.cpu.int_torch import TorchInt4Linear, TorchInt8Linear
from skipsearch.cpu.int_weights import (
    GROUPS,
    dequantize_int4,
    dequantize_int8,
    quantize_int4,
    quantize_int8,
)

needs_torch_kernels = pytest.mark.skipif(int_torch.available() is not None, reason=str(int_torch.available()))


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product with the dequantized weight, in float64."""
    out = x.double() @ weight.double().T
    return (out + bias.double() if bias is not None else out).float()


def test_int8_is_symmetric_per_row_and_within_half_a_step() -> None:
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(37, 200, generator=generator) * torch.rand(37, 1, generator=generator)
    weight[5] = 0  # a row of zeros keeps a finite scale
    quantized = quantize_int8(weight)
    assert quantized.q.dtype == torch.int8 and quantized.scale.dtype == torch.float32
    assert quantized.q.shape == (37, 200) and quantized.scale.shape == (37,)
    assert (
        int(quantized.q.min()) >= -127
        and int(quantized.q.abs().amax(dim=1)[torch.arange(37) != 5].min()) == 127
    )
    restored = dequantize_int8(quantized)
    assert torch.equal(restored, quantized.q.float() * quantized.scale[:, None])
    assert torch.all((restored - weight).abs() <= quantized.scale[:, None] / 2 * (1 + 1e-6))
    assert torch.equal(restored[5], torch.zeros(200))


@pytest.mark.parametrize("group", GROUPS)
def test_int4_is_asymmetric_per_group_and_within_half_a_step(group: int) -> None:
    generator = torch.Generator().manual_seed(group)
    weight = torch.randn(19, 256, generator=generator) + torch.randn(19, 1, generator=generator)
    weight[3, :group] = 0.25  # a constant group stands for its value exactly
    quantized = quantize_int4(weight, group)
    assert quantized.q.dtype == torch.uint8 and int(quantized.q.max()) <= 15
    assert quantized.scale.shape == quantized.zero.shape == (19, 256 // group)
    restored = dequantize_int4(quantized)
    scale = quantized.scale.repeat_interleave(group, dim=1)
    zero = quantized.zero.repeat_interleave(group, dim=1)
    assert torch.equal(restored, (quantized.q.float() - 8) * scale + zero)
    # half a step, plus the float32 roundings of the product and the sum (a few ulp of the group's values)
    slack = 4 * torch.finfo(torch.float32).eps * (weight.abs().amax(dim=1, keepdim=True) + zero.abs())
    assert torch.all((restored - weight).abs() <= scale / 2 + slack)
    assert torch.equal(restored[3, :group], torch.full((group,), 0.25))
    # every group's extremes are represented (q 0 and 15 used), so the 16 levels span it
    grouped = quantized.q.view(19, -1, group)
    assert torch.all(grouped.amin(dim=2)[torch.arange(19) != 3] == 0)
    assert torch.all(grouped.amax(dim=2)[torch.arange(19) != 3] == 15)


def test_int4_refuses_groups_it_does_not_know_and_inputs_not_in_whole_groups() -> None:
    with pytest.raises(ValueError, match="groups"):
        quantize_int4(torch.randn(4, 96), 48)
    with pytest.raises(ValueError, match="whole number"):
        quantize_int4(torch.randn(4, 96), 64)


def assert_torchs(
    y: torch.Tensor, x: torch.Tensor, product: torch.nn.Module, bias: torch.Tensor | None
) -> None:
    """torch's output against the float64 product of its input (rounded to its dtype) and its
    weights: float32, within float32 tolerance; bf16, within bf16's rounding of the product (2^-8
    of it, before the bias) and 2^-9 of its terms' magnitudes (the int8 kernel rounds more than its
    output: up to 6e-4 of them measured)."""
    rounded = x.to(product.dtype).float()
    expected = reference(rounded, product.weight, bias)
    if product.dtype == torch.float32:
        torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-4)
        return
    unbiased = rounded.double() @ product.weight.double().T
    magnitude = rounded.double().abs() @ product.weight.double().abs().T
    error = (y.double() - expected.double()).abs()
    assert torch.all(error <= 2**-8 * unbiased.abs() + 2**-9 * magnitude)


DTYPES = [torch.bfloat16, torch.float32]


@needs_torch_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize(("inputs", "out", "bias"), [(64, 37, True), (576, 130, False)])
def test_torch_int8_multiplies_by_the_dequantized_weights(
    dtype: torch.dtype, rows: int, inputs: int, out: int, bias: bool
) -> None:
    generator = torch.Generator().manual_seed(rows + out)
    weight = torch.randn(out, inputs, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    product = TorchInt8Linear(weight, b, dtype=dtype)
    y = product(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    assert_torchs(y, x, product, b)


@needs_torch_kernels
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("group", GROUPS)
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize(("inputs", "out", "bias"), [(128, 37, True), (640, 48, False)])
def test_torch_int4_multiplies_by_the_dequantized_weights(
    dtype: torch.dtype, group: int, rows: int, inputs: int, out: int, bias: bool
) -> None:
    """Outputs not a multiple of 16 are padded for torch's packing and cut off after."""
    generator = torch.Generator().manual_seed(rows + out + group)
    weight = torch.randn(out, inputs, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    product = TorchInt4Linear(weight, b, group, dtype=dtype)
    y = product(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    assert_torchs(y, x, product, b)
