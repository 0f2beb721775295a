"""The decode-attention kernels, over a bf16 cache (AVX-512 BF16) and over a float32 one (AVX2, and
AMX): the attention of float32 SDPA over the same K/V (for AMX, of its inputs rounded to bf16), for
decode, verify and KV-pattern blocks; declined where they do not apply; explained where they cannot
load."""

import pytest
import torch
import torch.nn.functional as F

from skipsearch.cpu import bf16_weights, native
from skipsearch.cpu import decode_attention as native_attention
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import (
    FP32_ATTENTION,
    KERNEL_AMX_ATTENTION,
    KERNEL_ATTENTION,
    KERNEL_FP32_ATTENTION,
)
from skipsearch.cpu.decode_attention import AMX_SOURCE, decode_attention, load_amx_kernel, load_kernel
from skipsearch.masks import KVPattern
from skipsearch.models.kernels import apply_attention
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import KERNEL_CACHE_DTYPES, needs_amx_attention, tiny_model, with_kernel


def reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sink: int, window: int
) -> torch.Tensor:
    """fp32 SDPA with the kernel's visibility: causal from the cache's end, sink + window if any."""
    queries, length = query.shape[2], key.shape[2]
    position = torch.arange(length - queries, length)[:, None]
    keys = torch.arange(length)[None]
    seen = keys <= position
    if window > 0:
        seen &= (keys < sink) | (keys > position - window)
    out = F.scaled_dot_product_attention(
        query.float(), key.float(), value.float(), attn_mask=seen, enable_gqa=True
    )
    return out.transpose(1, 2)


def within_rounding(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """The bf16 kernel rounds its float32 result to bf16 once: at most one bf16 step (2^-7
    relative); the fp32 kernel differs from SDPA only in summation order."""
    relative = 2**-7 if out.dtype == torch.bfloat16 else 1e-5
    return bool(((out.float() - expected).abs() <= expected.abs() * relative + 1e-5).all())


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (14, 2, 64), (4, 4, 32), (2, 1, 128)])
@pytest.mark.parametrize("queries", [1, 2, 5, 16])
@pytest.mark.parametrize("length", [16, 300, 2500])
@pytest.mark.parametrize(("sink", "window"), [(0, 0), (4, 64), (0, 100), (3, 1)])
def test_the_kernel_computes_fp32_attention_over_the_cache(
    dtype: torch.dtype, heads: int, kv_heads: int, dim: int, queries: int, length: int, sink: int, window: int
) -> None:
    generator = torch.Generator().manual_seed(length + queries)
    # the cache's buffers are longer than the filled part, as `GrowingLayer`'s views are
    buffers = [torch.randn(1, kv_heads, length + 40, dim, generator=generator).to(dtype) for _ in "kv"]
    key, value = (buffer[:, :, :length] for buffer in buffers)
    query = (3 * torch.randn(1, queries, heads, dim, generator=generator)).to(dtype).transpose(1, 2)
    out = decode_attention(query, key, value, dim**-0.5, sink, window)
    assert out is not None and out.shape == (1, queries, heads, dim) and out.dtype == dtype
    assert within_rounding(out, reference(query, key, value, sink, window))


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
@pytest.mark.parametrize("dim", [40, 200])
def test_the_kernel_reads_head_sizes_other_than_64(dtype: torch.dtype, dim: int) -> None:
    """Head sizes past 64 and not multiples of 64 take the kernels' generic loops; the bf16 kernel
    declines what is not a multiple of 32, the fp32 one what is not a multiple of 8."""
    generator = torch.Generator().manual_seed(dim)
    key, value = (torch.randn(1, 2, 600, dim, generator=generator).to(dtype) for _ in "kv")
    query = torch.randn(1, 4, 3, dim, generator=generator).to(dtype)
    out = decode_attention(query, key, value, dim**-0.5)
    if dtype == torch.bfloat16 and dim % 32:
        assert out is None
    else:
        assert within_rounding(out, reference(query, key, value, 0, 0))


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
@pytest.mark.parametrize(
    ("batch", "queries", "dim", "other"),
    [(2, 1, 64, None), (1, 17, 64, None), (1, 1, 12, None), (1, 1, 64, torch.float16)],
)
def test_the_kernel_declines_what_it_does_not_read(
    dtype: torch.dtype, batch: int, queries: int, dim: int, other: torch.dtype | None
) -> None:
    """A batch (whose masks may pad), a prefill-sized block, a head size that is not a whole number
    of vectors, or keys of another dtype go back to SDPA."""
    query = torch.randn(batch, 4, queries, dim).to(dtype)
    key = torch.randn(batch, 2, 40, dim).to(other or dtype)
    assert decode_attention(query, key, key.clone(), 0.1) is None


def test_no_kernel_reads_a_float16_cache() -> None:
    query, key = torch.randn(1, 4, 1, 64).half(), torch.randn(1, 2, 40, 64).half()
    assert decode_attention(query, key, key.clone(), 0.1) is None


@pytest.mark.parametrize(
    ("dtype", "flags", "missing"),
    [
        (torch.bfloat16, {"avx2", "avx512f"}, ("avx512_bf16", "avx512bw")),
        (torch.float32, {"sse4_2", "avx2"}, ("fma",)),
    ],
)
def test_a_cpu_without_the_features_gets_the_reason(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, flags: set, missing: tuple
) -> None:
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset(flags))
    library = load_kernel.__wrapped__(dtype)
    assert library.function is None and all(flag in library.reason for flag in missing)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_without_a_compiler_the_reason_says_so(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset(native_attention.SOURCES[dtype].needed_flags))
    monkeypatch.setattr(native, "compiler", lambda: None)
    library = load_kernel.__wrapped__(dtype)
    assert library.function is None and "no C compiler" in library.reason


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
def test_a_model_on_the_kernel_path_decodes_as_on_the_fp32_path(dtype: torch.dtype) -> None:
    """Prefill (SDPA on the upcast cache), cached verify blocks and single steps on the kernel path
    against the fp32 SDPA path: the same logits up to summation order (and bf16 rounding), the same
    argmax, and the kernel's cache in its own dtype."""
    kernel_path = KERNEL_ATTENTION if dtype == torch.bfloat16 else KERNEL_FP32_ATTENTION
    outputs = []
    for path in (FP32_ATTENTION, kernel_path):
        model = tiny_model("llama", layers=3, hidden_size=128, num_attention_heads=4).to(dtype)
        apply_attention(model, AttentionChoice(str(dtype).removeprefix("torch."), path))
        runner = LayerwiseRunner(model)
        cache = runner.new_cache()
        ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12]])
        chunks = (ids[:, :5], ids[:, 5:8], ids[:, 8:9], ids[:, 9:])
        outputs.append(torch.cat([runner.forward(chunk, cache=cache)[0] for chunk in chunks]).float())
        expected_kv = torch.float32 if path == FP32_ATTENTION else dtype
        assert cache.layers[0].keys.dtype == expected_kv
    fp32, kernel = outputs
    tolerance = 0.02 if dtype == torch.bfloat16 else 1e-5
    assert (fp32 - kernel).abs().max() < tolerance * fp32.abs().max()
    assert torch.equal(fp32.argmax(-1), kernel.argmax(-1))


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
def test_a_pattern_draft_step_on_the_kernel_reads_only_the_pattern(dtype: torch.dtype) -> None:
    """One draft step with s2w3 over a 40-position cache: the kernel's answer is `pattern_attention`'s."""
    from skipsearch.kv.patterns import pattern_attention

    generator = torch.Generator().manual_seed(1)
    key, value = (torch.randn(1, 2, 40, 64, generator=generator).to(dtype) for _ in "kv")
    query = torch.randn(1, 4, 1, 64, generator=generator).to(dtype)
    pattern = KVPattern(2, 3)
    expected = pattern_attention(query, key, value, pattern, 0.125)
    out = decode_attention(query, key, value, 0.125, pattern.sink, pattern.window)
    assert within_rounding(out, expected.float())


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
@pytest.mark.parametrize("length", [40, 700, 1500])
def test_a_query_gets_the_same_bits_alone_as_in_a_verify_block(dtype: torch.dtype, length: int) -> None:
    """Chunks and tiles start at fixed key positions, so each of a 5-position block's outputs is
    bit for bit the output of a single step at that position: verify recomputes the decode exactly."""
    generator = torch.Generator().manual_seed(length)
    key, value = (torch.randn(1, 3, length, 64, generator=generator).to(dtype) for _ in "kv")
    query = torch.randn(1, 9, 5, 64, generator=generator).to(dtype)
    block = decode_attention(query, key, value, 0.125)
    for i in range(5):
        end = length - 5 + i + 1
        alone = decode_attention(query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], 0.125)
        assert torch.equal(alone[:, 0], block[:, i])


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(KERNEL_FP32_ATTENTION, marks=with_kernel(torch.float32).marks),
        pytest.param(KERNEL_AMX_ATTENTION, marks=needs_amx_attention),
    ],
)
def test_on_the_fallback_plan_a_verify_block_computes_single_steps_bit_for_bit(path: str) -> None:
    """bf16 weights in the AVX2 product beside an fp32 decode kernel (AVX2 or AMX): every layer's
    output of a row is independent of the rows beside it, so a verify's logits are the single
    steps' exactly, and greedy SSD cannot part from autoregressive decoding."""
    if bf16_weights.load_kernel().function is None:
        pytest.skip(f"linear kernel unavailable: {bf16_weights.load_kernel().reason}")
    model = tiny_model("llama", layers=3, hidden_size=128, num_attention_heads=4)
    bf16_weights.use_bf16_weights(model)
    apply_attention(model, AttentionChoice("float32", path))
    runner = LayerwiseRunner(model)
    ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12, 7]])
    cache = runner.new_cache()
    runner.forward(ids[:, :8], cache=cache)
    block = runner.forward(ids[:, 8:], cache=cache)[0]
    cache.crop(-4)
    steps = torch.cat([runner.forward(ids[:, i : i + 1], cache=cache)[0] for i in range(8, 12)])
    assert torch.equal(block, steps)


def rounded_reference(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sink: int, window: int
) -> torch.Tensor:
    """`reference`'s attention in float64 on the inputs the AMX kernel multiplies: rounded to bf16."""
    query, key, value = (t.bfloat16().double() for t in (query, key, value))
    queries, length, group = query.shape[2], key.shape[2], query.shape[1] // key.shape[1]
    position = torch.arange(length - queries, length)[:, None]
    keys = torch.arange(length)[None]
    seen = keys <= position
    if window > 0:
        seen &= (keys < sink) | (keys > position - window)
    key, value = key.repeat_interleave(group, 1), value.repeat_interleave(group, 1)
    scores = (query @ key.transpose(-1, -2) * query.shape[-1] ** -0.5).masked_fill(~seen, float("-inf"))
    return (scores.softmax(-1) @ value).transpose(1, 2).float()


@needs_amx_attention
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (14, 2, 64), (4, 4, 32), (2, 1, 128)])
@pytest.mark.parametrize("queries", [1, 5, 16])
@pytest.mark.parametrize("length", [16, 300, 2500])
@pytest.mark.parametrize(("sink", "window"), [(0, 0), (4, 64), (3, 1)])
def test_the_amx_kernel_computes_the_attention_of_its_rounded_inputs(
    heads: int, kv_heads: int, dim: int, queries: int, length: int, sink: int, window: int
) -> None:
    """Queries, keys and values rounded to bf16, then exact attention: the kernel differs only by
    its softmax weights' rounding to bf16 (2^-9 relative each) and float32 sums."""
    generator = torch.Generator().manual_seed(length + queries)
    buffers = [torch.randn(1, kv_heads, length + 40, dim, generator=generator) for _ in "kv"]
    key, value = (buffer[:, :, :length] for buffer in buffers)
    query = (3 * torch.randn(1, queries, heads, dim, generator=generator)).transpose(1, 2)
    out = decode_attention(query, key.bfloat16(), value.bfloat16(), dim**-0.5, sink, window, amx=True)
    assert out is not None and out.shape == (1, queries, heads, dim) and out.dtype == torch.float32
    torch.testing.assert_close(out, rounded_reference(query, key, value, sink, window), rtol=0, atol=1e-2)


@needs_amx_attention
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (14, 2)])
@pytest.mark.parametrize("length", [40, 700, 1500])
@pytest.mark.parametrize(("sink", "window"), [(0, 0), (4, 64)])
def test_on_amx_a_query_gets_the_same_bits_alone_as_in_a_verify_block(
    heads: int, kv_heads: int, length: int, sink: int, window: int
) -> None:
    """Each tile element sums only its own row's products, so each of a 5-position block's outputs
    is bit for bit a single step's at that position, in blocks of 16 rows or several (14 heads x 5)."""
    generator = torch.Generator().manual_seed(length)
    key, value = (torch.randn(1, kv_heads, length, 64, generator=generator).bfloat16() for _ in "kv")
    query = torch.randn(1, heads, 5, 64, generator=generator)
    block = decode_attention(query, key, value, 0.125, sink, window, amx=True)
    for i in range(5):
        end = length - 5 + i + 1
        alone = decode_attention(
            query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], 0.125, sink, window, amx=True
        )
        assert torch.equal(alone[:, 0], block[:, i])


@needs_amx_attention
def test_the_amx_kernel_declines_what_it_does_not_read() -> None:
    """A head size that is not a whole number of tiles, a float32 cache, or bf16 queries."""
    key = torch.randn(1, 2, 40, 48).bfloat16()
    assert decode_attention(torch.randn(1, 4, 1, 48), key, key.clone(), 0.1, amx=True) is None
    key = torch.randn(1, 2, 40, 64)
    assert decode_attention(torch.randn(1, 4, 1, 64), key, key.clone(), 0.1, amx=True) is None
    key = key.bfloat16()
    assert decode_attention(torch.randn(1, 4, 1, 64).bfloat16(), key, key.clone(), 0.1, amx=True) is None


def test_a_cpu_without_amx_gets_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset(AMX_SOURCE.needed_flags) - {"amx_tile"})
    library = load_amx_kernel.__wrapped__()
    assert library.function is None and "amx_tile" in library.reason
