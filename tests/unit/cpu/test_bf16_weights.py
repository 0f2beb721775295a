"""The fallback plan's bf16-weight products (`cpu.bf16_weights`): the kernel multiplies by the
weights rounded to bf16 in float32 arithmetic, a row's output does not depend on the rows beside
it, and a model on it decodes losslessly with self-speculation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from skipsearch.cpu import bf16_weights
from skipsearch.cpu.bf16_weights import (
    MAX_ROWS,
    TILES,
    Bf16WeightLinear,
    load_kernel,
    pack_tiles,
    pack_weight,
    unpack_tiles,
    unpack_weight,
    use_bf16_weights,
)
from skipsearch.cpu.inventory import step_bytes
from skipsearch.cpu.native import NativeLibrary, load_native
from tests.conftest import assert_greedy_ssd_lossless, needs_tiles, tiny_model

needs_kernel = pytest.mark.skipif(
    load_kernel().function is None, reason=f"linear kernel unavailable: {load_kernel().reason}"
)


def rounded_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The exact product with the bf16-rounded weight, in float64."""
    out = x.double() @ weight.bfloat16().double().T
    return (out + bias.double() if bias is not None else out).float()


@pytest.mark.parametrize("out", [4, 37, 130])
def test_packing_keeps_the_rounded_weights_exactly(out: int) -> None:
    weight = torch.randn(out, 24)
    packed = pack_weight(weight)
    assert packed.dtype == torch.bfloat16 and packed.is_contiguous()
    assert torch.equal(unpack_weight(packed, out, 24), weight.bfloat16().float())
    assert torch.equal(Bf16WeightLinear(weight, None).weight, weight.bfloat16().float())


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, MAX_ROWS])
@pytest.mark.parametrize(("inputs", "out", "bias"), [(64, 37, True), (200, 130, False), (8, 4, True)])
def test_the_kernel_multiplies_by_the_rounded_weights(rows: int, inputs: int, out: int, bias: bool) -> None:
    generator = torch.Generator().manual_seed(rows * out)
    weight = torch.randn(out, inputs, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    y = Bf16WeightLinear(weight, b)(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    torch.testing.assert_close(y, rounded_product(x, weight, b), rtol=1e-5, atol=1e-5)


@needs_kernel
def test_a_rows_output_does_not_depend_on_the_rows_beside_it() -> None:
    """The property that makes a verify's products equal the decode steps' bit for bit: every row
    of a block of 1..MAX_ROWS rows equals that row multiplied alone."""
    generator = torch.Generator().manual_seed(0)
    product = Bf16WeightLinear(
        torch.randn(150, 96, generator=generator), torch.randn(150, generator=generator)
    )
    x = torch.randn(MAX_ROWS, 96, generator=generator)
    alone = torch.cat([product(x[r : r + 1]) for r in range(MAX_ROWS)])
    for rows in range(1, MAX_ROWS + 1):
        for start in (0, MAX_ROWS - rows):
            assert torch.equal(product(x[start : start + rows]), alone[start : start + rows]), (rows, start)


BUILDS = [(source, load_native(source)) for source in bf16_weights.SOURCES]


@pytest.mark.parametrize(
    ("source", "library"),
    [
        pytest.param(*build, marks=pytest.mark.skipif(build[1].function is None, reason=build[1].reason))
        for build in BUILDS
    ],
    ids=[" ".join(source.compiler_flags[-1:]) for source, _ in BUILDS],
)
@pytest.mark.parametrize("inputs", [96, 200])
def test_every_build_this_cpu_runs_multiplies_rows_alike_and_by_the_rounded_weights(
    source: object, library: NativeLibrary, inputs: int
) -> None:
    """The AVX2 build and the AVX-512 one (16 inputs a chunk; 200 leaves a masked tail of 8), each on
    its own layout: the rounded weights' product, and a row's bits whatever the rows beside it."""
    generator = torch.Generator().manual_seed(inputs)
    weight, bias = torch.randn(37, inputs, generator=generator), torch.randn(37, generator=generator)
    width = library.handle.linear_rows_lanes()
    packed = pack_weight(weight, width)
    assert torch.equal(unpack_weight(packed, 37, inputs), weight.bfloat16().float())
    x = torch.randn(1, 6, inputs, generator=generator)
    block = bf16_weights.multiply(library.function, x, 6, packed, 37, bias)
    torch.testing.assert_close(block, rounded_product(x, weight, bias), rtol=1e-5, atol=1e-5)
    for row in range(6):
        alone = bf16_weights.multiply(library.function, x[:, row : row + 1].contiguous(), 1, packed, 37, bias)
        assert torch.equal(alone, block[:, row : row + 1])


def test_long_blocks_and_other_dtypes_multiply_the_same_rounded_weights_in_torch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Beyond `MAX_ROWS` rows (a prefill), for a bf16 input, or without the kernel, the product is
    torch's on the same rounded weights."""
    weight, bias = torch.randn(40, 32), torch.randn(40)
    product = Bf16WeightLinear(weight, bias)
    long = torch.randn(1, MAX_ROWS + 3, 32)
    torch.testing.assert_close(product(long), rounded_product(long, weight, bias), rtol=1e-5, atol=1e-5)
    half = torch.randn(2, 32).bfloat16()
    assert product(half).dtype == torch.bfloat16
    monkeypatch.setattr(bf16_weights, "load_kernel", lambda: bf16_weights.NativeLibrary(None, "stubbed"))
    short = torch.randn(3, 32)
    assert torch.equal(product(short), F.linear(short, weight.bfloat16().float(), bias))


def test_only_matrices_with_inputs_in_chunks_of_8_are_replaced_from_float32_or_bf16() -> None:
    """A matrix loaded in bf16 already (`models.weight_layout`) packs to the bits its float32 had."""
    model = nn.Sequential(nn.Linear(16, 12), nn.Linear(12, 8), nn.Linear(8, 8), nn.Linear(8, 8).half())
    wide = model[2].weight.detach().clone()
    model[2].weight.data = wide.bfloat16()
    assert use_bf16_weights(model) == 2
    assert [type(m) for m in model] == [Bf16WeightLinear, nn.Linear, Bf16WeightLinear, nn.Linear]
    assert torch.equal(model[2].packed, Bf16WeightLinear(wide, None).packed)


def test_a_step_reads_the_bf16_copies_and_the_embedding_only_row_by_row() -> None:
    model = tiny_model("llama", layers=2)
    _, kv = step_bytes(model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    packed = sum(-(-m.out_features // 2) * 2 * m.in_features * 2 for m in linears)  # bf16, blocks of 2 rows
    linear_ids = {id(m.weight) for m in linears}
    embedding = model.model.embed_tokens.weight
    others = sum(p.numel() * 4 for p in model.parameters() if id(p) not in linear_ids and p is not embedding)
    use_bf16_weights(model)
    assert step_bytes(model) == (packed + others, kv)


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_self_speculation_on_bf16_weights_is_lossless(family: str) -> None:
    """Greedy SSD equals autoregressive decoding token for token on the plan: the verify's products
    are the steps' bit for bit, and its attention is float32."""
    model = tiny_model(family, layers=4, hidden_size=64, num_attention_heads=4)
    assert use_bf16_weights(model) == 4 * 7 + 1
    assert_greedy_ssd_lossless(model)


@needs_kernel
def test_inputs_not_contiguous_multiply_like_their_contiguous_copies() -> None:
    """The fast path reads rows at the input width apart, so any other layout is copied first."""
    product = Bf16WeightLinear(torch.randn(40, 32), torch.randn(40))
    rows_apart = torch.randn(3, 2, 32)[None, :, 0]  # [1, 3, 32], rows 64 floats apart
    every_other = torch.randn(2, 64)[:, ::2]
    for x in (rows_apart, every_other):
        assert not x.is_contiguous()
        assert torch.equal(product(x), product(x.contiguous()))


@pytest.mark.parametrize(("out", "inputs"), [(4, 24), (37, 40), (130, 96)])
def test_the_tile_layout_keeps_the_rounded_weights_exactly(out: int, inputs: int) -> None:
    weight = torch.randn(out, inputs)
    packed = pack_tiles(weight)
    assert packed.dtype == torch.bfloat16 and packed.is_contiguous()
    assert torch.equal(unpack_tiles(packed, out, inputs), weight.bfloat16().float())
    assert torch.equal(Bf16WeightLinear(weight, None, TILES).weight, weight.bfloat16().float())


@needs_tiles
@pytest.mark.parametrize("rows", [1, 3, 5, MAX_ROWS])
@pytest.mark.parametrize(("inputs", "out", "bias"), [(64, 37, True), (200, 130, False), (8, 4, True)])
def test_the_tile_kernel_multiplies_the_rounded_inputs_by_the_rounded_weights(
    rows: int, inputs: int, out: int, bias: bool
) -> None:
    """AMX multiplies bf16 pairs: the product is the float64 one of both rounded, to float32 sums."""
    generator = torch.Generator().manual_seed(rows * out)
    weight = torch.randn(out, inputs, generator=generator)
    b = torch.randn(out, generator=generator) if bias else None
    x = torch.randn(1, rows, inputs, generator=generator)
    y = Bf16WeightLinear(weight, b, TILES)(x)
    assert y.shape == (1, rows, out) and y.dtype == torch.float32
    torch.testing.assert_close(y, rounded_product(x.bfloat16().float(), weight, b), rtol=1e-5, atol=1e-5)


@needs_tiles
def test_a_rows_output_on_tiles_does_not_depend_on_the_rows_beside_it() -> None:
    """As for the vector kernel: what makes greedy SSD on the tile kernel equal autoregressive
    decoding token for token."""
    generator = torch.Generator().manual_seed(1)
    product = Bf16WeightLinear(
        torch.randn(150, 100, generator=generator), torch.randn(150, generator=generator), TILES
    )
    x = torch.randn(MAX_ROWS, 100, generator=generator)
    alone = torch.cat([product(x[r : r + 1]) for r in range(MAX_ROWS)])
    for rows in range(1, MAX_ROWS + 1):
        for start in (0, MAX_ROWS - rows):
            assert torch.equal(product(x[start : start + rows]), alone[start : start + rows]), (rows, start)


@needs_tiles
def test_long_blocks_on_tiles_are_the_steps_bits() -> None:
    """A prefill on the tile kernel runs in blocks of 16 rows: each position's products are the
    bits a one-row step computes, so a prefill and the steps after it agree exactly."""
    weight, bias = torch.randn(40, 32), torch.randn(40)
    product = Bf16WeightLinear(weight, bias, TILES)
    long = torch.randn(1, 2 * MAX_ROWS + 3, 32)
    y = product(long)
    torch.testing.assert_close(
        y, rounded_product(long.bfloat16().float(), weight, bias), rtol=1e-5, atol=1e-5
    )
    assert torch.equal(y, torch.cat([product(long[:, r : r + 1]) for r in range(long.shape[1])], dim=1))
