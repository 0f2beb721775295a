"""The decode-attention kernel: the attention of float32 SDPA over the same bf16 K/V, for decode,
verify and KV-pattern blocks; declined where it does not apply; explained where it cannot load."""

import pytest
import torch
import torch.nn.functional as F

from skipsearch.masks import KVPattern
from skipsearch.models import native, native_attention
from skipsearch.models.attention import FP32_ATTENTION, KERNEL_ATTENTION
from skipsearch.models.kernels import AttentionChoice, apply_attention
from skipsearch.models.native_attention import decode_attention, load_kernel
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

needs_kernel = pytest.mark.skipif(
    load_kernel().function is None, reason=f"decode kernel unavailable: {load_kernel().reason}"
)


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


def within_bf16_rounding(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """The kernel rounds its float32 result to bf16 once: at most one bf16 step (2^-7 relative)."""
    return bool(((out.float() - expected).abs() <= expected.abs() * 2**-7 + 1e-5).all())


@needs_kernel
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (14, 2, 64), (4, 4, 32), (2, 1, 128)])
@pytest.mark.parametrize("queries", [1, 2, 5, 16])
@pytest.mark.parametrize("length", [16, 300, 2500])
@pytest.mark.parametrize(("sink", "window"), [(0, 0), (4, 64), (0, 100), (3, 1)])
def test_the_kernel_computes_fp32_attention_over_the_bf16_cache(
    heads: int, kv_heads: int, dim: int, queries: int, length: int, sink: int, window: int
) -> None:
    generator = torch.Generator().manual_seed(length + queries)
    # the cache's buffers are longer than the filled part, as `GrowingLayer`'s views are
    buffers = [torch.randn(1, kv_heads, length + 40, dim, generator=generator).bfloat16() for _ in "kv"]
    key, value = (buffer[:, :, :length] for buffer in buffers)
    query = (3 * torch.randn(1, queries, heads, dim, generator=generator)).bfloat16().transpose(1, 2)
    out = decode_attention(query, key, value, dim**-0.5, sink, window)
    assert out is not None and out.shape == (1, queries, heads, dim) and out.dtype == torch.bfloat16
    assert within_bf16_rounding(out, reference(query, key, value, sink, window))


@needs_kernel
@pytest.mark.parametrize(
    ("batch", "queries", "dim", "dtype"),
    [
        (2, 1, 64, torch.bfloat16),
        (1, 17, 64, torch.bfloat16),
        (1, 1, 16, torch.bfloat16),
        (1, 1, 64, torch.float32),
    ],
)
def test_the_kernel_declines_what_it_does_not_read(
    batch: int, queries: int, dim: int, dtype: torch.dtype
) -> None:
    """A batch (whose masks may pad), a prefill-sized block, a head size that is not a multiple of
    32, or another dtype go back to SDPA."""
    query = torch.randn(batch, 4, queries, dim).to(dtype)
    key = torch.randn(batch, 2, 40, dim).to(dtype)
    assert decode_attention(query, key, key.clone(), 0.1) is None


def test_a_cpu_without_the_features_gets_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset({"avx2", "avx512f"}))
    library = load_kernel.__wrapped__()
    assert library.function is None and "avx512_bf16" in library.reason and "avx512bw" in library.reason


def test_without_a_compiler_the_reason_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "cpu_flags", lambda: frozenset(native_attention.SOURCE.needed_flags))
    monkeypatch.setattr(native, "compiler", lambda: None)
    library = load_kernel.__wrapped__()
    assert library.function is None and "no C compiler" in library.reason


@needs_kernel
def test_a_model_on_the_kernel_path_decodes_as_on_the_fp32_path() -> None:
    """Prefill (SDPA on the upcast cache), cached verify blocks and single steps on the kernel path
    against the fp32 path: the same logits up to summation order and bf16 rounding, the same argmax,
    and a bf16 cache beside it."""
    outputs = []
    for path in (FP32_ATTENTION, KERNEL_ATTENTION):
        model = tiny_model("llama", layers=3, hidden_size=128, num_attention_heads=4).to(torch.bfloat16)
        apply_attention(model, AttentionChoice("bfloat16", path))
        runner = LayerwiseRunner(model)
        cache = runner.new_cache()
        ids = torch.tensor([[5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12]])
        chunks = (ids[:, :5], ids[:, 5:8], ids[:, 8:9], ids[:, 9:])
        outputs.append(torch.cat([runner.forward(chunk, cache=cache)[0] for chunk in chunks]).float())
        expected_kv = torch.float32 if path == FP32_ATTENTION else torch.bfloat16
        assert cache.layers[0].keys.dtype == expected_kv
    fp32, kernel = outputs
    assert (fp32 - kernel).abs().max() < 0.02 * fp32.abs().max()
    assert torch.equal(fp32.argmax(-1), kernel.argmax(-1))


@needs_kernel
def test_a_pattern_draft_step_on_the_kernel_reads_only_the_pattern() -> None:
    """One draft step with s2w3 over a 40-position cache: the kernel's answer is `pattern_attention`'s."""
    from skipsearch.models.kv_attention import pattern_attention

    generator = torch.Generator().manual_seed(1)
    key, value = (torch.randn(1, 2, 40, 64, generator=generator).bfloat16() for _ in "kv")
    query = torch.randn(1, 4, 1, 64, generator=generator).bfloat16()
    pattern = KVPattern(2, 3)
    expected = pattern_attention(query, key, value, pattern, 0.125)
    out = decode_attention(query, key, value, 0.125, pattern.sink, pattern.window)
    assert within_bf16_rounding(out, expected.float())


@needs_kernel
@pytest.mark.parametrize("length", [40, 700, 1500])
def test_a_query_gets_the_same_bits_alone_as_in_a_verify_block(length: int) -> None:
    """Chunks and tiles start at fixed key positions, so each of a 5-position block's outputs is
    bit for bit the output of a single step at that position: verify recomputes the decode exactly."""
    generator = torch.Generator().manual_seed(length)
    key, value = (torch.randn(1, 3, length, 64, generator=generator).bfloat16() for _ in "kv")
    query = torch.randn(1, 9, 5, 64, generator=generator).bfloat16()
    block = decode_attention(query, key, value, 0.125)
    for i in range(5):
        end = length - 5 + i + 1
        alone = decode_attention(query[:, :, i : i + 1], key[:, :, :end], value[:, :, :end], 0.125)
        assert torch.equal(alone[:, 0], block[:, i])
