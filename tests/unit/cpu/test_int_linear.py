"""Our int8 and int4 weight-only products (`cpu.int_linear`, `linear_rows_int.c`): the layouts keep
the quantized weights exactly, the kernel multiplies by the dequantized weights within float32
reassociation (`assert_reassociated`: each output within 1e-5 of the sum of its terms' magnitudes
from the float64 product), and a row's output does not depend on the rows beside it, in every build
this CPU runs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from skipsearch.cpu import int_linear
from skipsearch.cpu.int_linear import (
    INT4,
    INT8,
    MAX_ROWS,
    OUT_BLOCK,
    Int4Linear,
    Int8Linear,
    builds,
    int4_block,
    pack_int4,
    pack_int8,
    unpack_int4,
    unpack_int8,
)
from skipsearch.cpu.int_weights import GROUPS, dequantize_int4, quantize_int4, quantize_int8

WIDTHS = (8, 16)  # the AVX2 build's chunks and the AVX-512 build's


def build_params(kind: str) -> list[object]:
    """Each build's width, skipped where this CPU does not run it."""
    loaded = builds(kind)
    return [
        pytest.param(
            width, marks=pytest.mark.skipif(width not in loaded, reason=f"no {width}-wide {kind} build")
        )
        for width in WIDTHS
    ]


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The product with the dequantized weight, in float64."""
    out = x.double() @ weight.double().T
    return (out + bias.double() if bias is not None else out).float()


def assert_reassociated(
    y: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    zero: torch.Tensor | None = None,
) -> None:
    """`y` is the float64 product with `weight` (plus `bias`) within 1e-5 of the magnitudes summed:
    float32 sums in any order stay within n * 2^-24 of them (n <= 1024 terms here, over 16 or 8
    lanes); with int4 each weight's magnitude counts its group's `zero` too (`(q - 8) s` and `z`
    are summed in float32 before it is multiplied)."""
    magnitude = x.double().abs() @ weight.double().abs().T
    if zero is not None:
        magnitude += x.double().abs() @ zero.double().abs().T
    if bias is not None:
        magnitude += bias.double().abs()
    error = (y.double() - reference(x, weight, bias).double()).abs()
    assert torch.all(error <= 1e-5 * magnitude), float((error / magnitude).max())


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(("out", "inputs"), [(4, 24), (37, 200), (130, 96)])
def test_the_int8_layout_keeps_the_values_exactly(width: int, out: int, inputs: int) -> None:
    q = quantize_int8(torch.randn(out, inputs)).q
    packed = pack_int8(q, width)
    assert packed.dtype == torch.int8 and packed.is_contiguous()
    assert packed.shape == (-(-out // OUT_BLOCK), -(-inputs // width), OUT_BLOCK, width)
    assert torch.equal(unpack_int8(packed, out, inputs), q)


LAYOUTS4 = [(3, 384), (37, 384), (5, 576), (6, 896), (7, 224), (9, 160)]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize(
    ("out", "inputs", "group"),
    [(*shape, group) for shape in LAYOUTS4 for group in GROUPS if shape[1] % group == 0],
)
def test_the_int4_layout_keeps_the_values_and_groups_exactly(
    width: int, group: int, out: int, inputs: int
) -> None:
    quantized = quantize_int4(torch.randn(out, inputs), group)
    words, params = pack_int4(quantized, width)
    assert words.dtype == torch.int32 and params.dtype == torch.bfloat16
    back = unpack_int4(words, params, out, inputs, group, width)
    for name in ("q", "scale", "zero"):
        assert torch.equal(getattr(back, name), getattr(quantized, name)), name
    # lane i of a block's word w holds in nibble j input 8 w + j of the block's output i
    block = int4_block(width)
    word = int(words[0, 1, 2]) & 0xFFFFFFFF
    assert [(word >> 4 * j) & 15 for j in range(8)] == [int(quantized.q[2, 8 + j]) for j in range(8)]
    # half a byte a value, no padding along the inputs; outputs padded to whole blocks
    assert words.shape == (-(-out // block), inputs // 8, block)
    assert params.shape == (-(-out // block), inputs // group, block, 2)


@pytest.mark.parametrize("width", build_params(INT8))
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 7, 12, 13, MAX_ROWS])
@pytest.mark.parametrize(("inputs", "out", "bias"), [(64, 37, True), (200, 131, False), (8, 3, True)])
def test_the_int8_kernel_multiplies_by_the_dequantized_weights(
    width: int, rows: int, inputs: int, out: int, bias: bool
) -> None:
    """200 inputs leave the AVX-512 build a masked tail of 8; odd outputs a half-empty block."""
    generator = torch.Generator().manual_seed(rows * out)
    weight = torch.randn(out, inputs, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    product = Int8Linear(weight, b, width=width)
    y = product(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    assert_reassociated(y, x, product.weight, b)


SHAPES4 = [
    (128, 37, True),
    (384, 131, False),
    (896, 5, True),
    (576, 9, True),
    (224, 7, False),
    (160, 6, True),
]
CASES4 = [(*shape, group) for shape in SHAPES4 for group in GROUPS if shape[0] % group == 0]  # whole groups


@pytest.mark.parametrize("width", build_params(INT4))
@pytest.mark.parametrize("rows", [1, 3, 5, 8, 9, MAX_ROWS])
@pytest.mark.parametrize(("inputs", "out", "bias", "group"), CASES4)
def test_the_int4_kernel_multiplies_by_the_dequantized_weights(
    width: int, rows: int, inputs: int, out: int, bias: bool, group: int
) -> None:
    """Blocks are 2 vectors of outputs (32 at 16 wide, 16 at 8): 37, 131, 9, 7 end in a part-empty
    one; more rows than a pass holds (4 at 16 wide, 2 at 8) take several passes."""
    generator = torch.Generator().manual_seed(rows * out + group)
    weight = torch.randn(out, inputs, generator=generator) + torch.randn(out, 1, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    product = Int4Linear(weight, b, group, width=width)
    y = product(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    zero = product.quantized().zero.repeat_interleave(group, dim=1)
    assert_reassociated(y, x, product.weight, b, zero)


def _products(width: int) -> list[torch.nn.Module]:
    generator = torch.Generator().manual_seed(width)
    weight, bias = torch.randn(151, 384, generator=generator), torch.randn(151, generator=generator)
    found = []
    if width in builds(INT8):
        found.append(Int8Linear(weight, bias, width=width))
    if width in builds(INT4):
        found += [Int4Linear(weight, bias, group, width=width) for group in GROUPS]
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_a_rows_output_does_not_depend_on_the_rows_beside_it(width: int) -> None:
    """What makes a verify's products equal the draft steps' bit for bit: every row of a block of
    1..MAX_ROWS rows equals that row multiplied alone, in each build."""
    products = _products(width)
    if not products:
        pytest.skip(f"no {width}-wide build on this CPU")
    x = torch.randn(MAX_ROWS, 384, generator=torch.Generator().manual_seed(1))
    for product in products:
        alone = torch.cat([product(x[r : r + 1]) for r in range(MAX_ROWS)])
        for rows in range(1, MAX_ROWS + 1):
            for start in (0, MAX_ROWS - rows):
                assert torch.equal(product(x[start : start + rows]), alone[start : start + rows]), (
                    product,
                    rows,
                )


@pytest.mark.parametrize("width", build_params(INT4))
def test_an_int4_column_reads_back_as_its_group_sums_it(width: int) -> None:
    """One input set to 1 at a time reads a column back as the kernel forms it, bit for bit in both
    builds: `q s` (exact) plus `z - 8 s` (rounded once), one rounding from `dequantize_int4`'s
    `(q - 8) s + z`; nibbles 0..7 of a word (inputs 8 w + j) each scale their input differently."""
    weight = torch.randn(37, 256) * 3 + 1
    product = Int4Linear(weight, None, 32, width=width)
    quantized = product.quantized()
    scale = quantized.scale.repeat_interleave(32, dim=1)
    zero = quantized.zero.repeat_interleave(32, dim=1)
    formed = quantized.q.float() * scale + (zero - 8 * scale)
    assert torch.allclose(formed, dequantize_int4(quantized), rtol=0, atol=1e-6 * float(zero.abs().max()))
    for k in (0, 1, 6, 7, 17, 100, 255):
        x = torch.zeros(1, 256)
        x[0, k] = 1
        assert torch.equal(product(x)[0], formed[:, k]), k


def test_long_blocks_other_dtypes_and_no_kernel_multiply_the_dequantized_weights_in_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weight, bias = torch.randn(40, 128), torch.randn(40)
    for product in (Int8Linear(weight, bias), Int4Linear(weight, bias, 64)):
        long = torch.randn(1, MAX_ROWS + 3, 128)
        torch.testing.assert_close(product(long), reference(long, product.weight, bias), rtol=1e-4, atol=1e-4)
        assert product(torch.randn(2, 128).bfloat16()).dtype == torch.bfloat16
    monkeypatch.setattr(int_linear, "builds", lambda kind: {})
    short = torch.randn(3, 128)
    for product in (Int8Linear(weight, bias), Int4Linear(weight, bias, 64)):
        assert torch.equal(product(short), F.linear(short, product.weight, bias))


def test_fits_says_which_matrices_the_kernels_read() -> None:
    assert int_linear.fits(torch.randn(4, 24)) and not int_linear.fits(torch.randn(4, 12))
    assert int_linear.fits(torch.randn(4, 576), 64) and not int_linear.fits(torch.randn(4, 576), 128)
    assert not int_linear.fits(torch.randint(0, 3, (4, 24)))


def test_int8_inputs_not_in_chunks_of_8_multiply_in_torch() -> None:
    weight, bias = torch.randn(6, 12), torch.randn(6)
    product = Int8Linear(weight, bias)
    x = torch.randn(2, 12)
    assert torch.equal(product(x), F.linear(x, product.weight, bias))


def test_inputs_not_contiguous_multiply_like_their_contiguous_copies() -> None:
    for product in (
        Int8Linear(torch.randn(40, 64), torch.randn(40)),
        Int4Linear(torch.randn(40, 64), None, 32),
    ):
        every_other = torch.randn(2, 128)[:, ::2]
        assert not every_other.is_contiguous()
        assert torch.equal(product(every_other), product(every_other.contiguous()))


def test_the_packed_bytes_are_a_half_and_about_a_quarter_of_bf16s() -> None:
    weight = torch.randn(4864, 896)  # Qwen2.5-0.5B's gate: 7 groups of 128
    bf16 = 4864 * 896 * 2
    assert Int8Linear(weight, None).packed_bytes() == bf16 // 2 + 4 * 4864
    assert Int4Linear(weight, None, 128).packed_bytes() == bf16 // 4 + 4864 * 7 * 4  # bf16 scale and zero
