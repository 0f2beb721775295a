"""Pillars (`kv.pillars`): chosen by the full model's attention mass inside their region, read
by the decode kernel as `pattern_attention` reads them, and their scores written by the kernel as
`query_scores` computes them."""

from unittest import mock

import pytest
import torch

from skipsearch.cpu import decode_attention as native_attention
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import KERNEL_AMX_ATTENTION, KERNEL_ATTENTION, KERNEL_FP32_ATTENTION
from skipsearch.cpu.decode_attention import decode_attention
from skipsearch.cpu.native import NativeLibrary
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.kv.patterns import pattern_attention
from skipsearch.kv.pillars import PillarChoice, PillarKeys, choose_pillars, query_scores
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.kernels import apply_attention
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import KERNEL_CACHE_DTYPES, needs_amx_attention, tiny_model


def test_pillars_are_the_keys_of_most_mass_between_sink_and_window() -> None:
    scores = torch.full((1, 4, 1, 40), -2.0)  # 4 query heads on 2 K/V heads
    scores[0, 0, 0, [1, 12, 30]] = 5.0  # 1 is in the sink, 30 in the window of any later draft
    scores[0, 1, 0, 17] = 4.0
    scores[0, 2, 0, 25] = 6.0  # K/V head 1
    scores[0, 3, 0, 8] = 3.0
    pattern = KVPattern(sink=2, window=8, pillars=2)  # the region of source 32: [2, 25)
    positions, valid = choose_pillars(scores, torch.tensor([[32]]), pattern, kv_heads=2)
    assert positions.shape == (1, 1, 2, 2) and bool(valid.all())
    assert sorted(positions[0, 0, 0].tolist()) == [12, 17]
    assert 25 not in positions[0, 0, 1].tolist() and 8 in positions[0, 0, 1].tolist()


def test_a_region_narrower_than_the_pillars_yields_fewer() -> None:
    pattern = KVPattern(sink=2, window=8, pillars=6)
    positions, valid = choose_pillars(torch.zeros(1, 2, 1, 14), torch.tensor([[12]]), pattern, kv_heads=1)
    assert valid[0, 0, 0].sum() == 3  # [2, 5)
    assert sorted(positions[0, 0, 0][valid[0, 0, 0]].tolist()) == [2, 3, 4]
    choice = PillarChoice(pattern, torch.tensor([[12]]), layers=1, kv_heads=1)
    choice.record(0, torch.zeros(1, 2, 1, 14))
    assert choice.first_row(0).tolist() == [[2, 3, 4]]


def test_query_scores_hide_what_causality_hides() -> None:
    generator = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 4, 3, 8, generator=generator), torch.randn(1, 2, 10, 8, generator=generator)
    scores = query_scores(query, key, 0.5)
    assert scores.shape == (1, 4, 3, 10)
    assert torch.isinf(scores[0, :, 0, 8:]).all() and torch.isfinite(scores[0, :, 0, :8]).all()
    expected = (query[0, 3, 2] @ key[0, 1].T) * 0.5  # head 3 reads K/V head 1
    torch.testing.assert_close(scores[0, 3, 2], expected)
    assert query_scores(query, key, 0.5, rows=1).shape == (1, 4, 1, 10)


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
@pytest.mark.parametrize("length", [60, 1300])
def test_the_kernel_reads_pillars_as_pattern_attention_does(dtype: torch.dtype, length: int) -> None:
    generator = torch.Generator().manual_seed(length)
    key, value = (torch.randn(1, 3, length, 64, generator=generator).to(dtype) for _ in "kv")
    query = (2 * torch.randn(1, 9, 1, 64, generator=generator)).to(dtype)
    pattern = KVPattern(2, 16, 5)
    chosen = torch.stack([torch.randperm(length - 30, generator=generator)[:5] + 2 for _ in range(3)])
    cache = type("Cache", (), {"layers": [type("Layer", (), {"keys": key, "values": value})()]})()
    pillars = PillarKeys.gather(pattern, [chosen], cache).of_layer(0)
    assert torch.equal(pillars[0][0, 1, 3], key[0, 1, chosen[1, 3]])
    expected = pattern_attention(query, key, value, pattern, 0.125, pillars)
    out = decode_attention(query, key, value, 0.125, pattern.sink, pattern.window, pillars)
    relative = 2**-7 if dtype == torch.bfloat16 else 1e-5
    assert ((out.float() - expected.float()).abs() <= expected.float().abs() * relative + 1e-4).all()
    without = decode_attention(query, key, value, 0.125, pattern.sink, pattern.window)
    assert not torch.equal(out, without)


@pytest.mark.parametrize("dtype", KERNEL_CACHE_DTYPES)
def test_the_kernel_writes_the_first_querys_scores(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(3)
    key, value = (torch.randn(1, 3, 900, 64, generator=generator).to(dtype) for _ in "kv")
    query = torch.randn(1, 9, 4, 64, generator=generator).to(dtype)  # a verify of 3 drafts
    scores = torch.full((9, 900), float("-inf"))
    assert decode_attention(query, key, value, 0.125, scores=scores) is not None
    expected = query_scores(query, key, 0.125, rows=1)[0, :, 0]
    assert torch.equal(torch.isinf(scores), torch.isinf(expected))  # the last 3 keys come after it
    torch.testing.assert_close(scores, expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    ("dtype", "path"),
    [
        pytest.param(torch.bfloat16, KERNEL_ATTENTION, marks=KERNEL_CACHE_DTYPES[0].marks),
        pytest.param(torch.float32, KERNEL_FP32_ATTENTION, marks=KERNEL_CACHE_DTYPES[1].marks),
        pytest.param(torch.float32, KERNEL_AMX_ATTENTION, marks=needs_amx_attention),
    ],
)
def test_on_the_kernel_path_pillars_come_from_the_kernels_scores_and_decode_losslessly(
    dtype: torch.dtype, path: str
) -> None:
    """On a decode kernel (bf16, or the fp32 fallback's AVX2 or AMX one): each verify's pillars come
    out of the kernel's score rows, the draft reads them through the kernel, and greedy SSD still
    gives the autoregressive tokens."""
    model = tiny_model("llama", layers=3, hidden_size=128, num_attention_heads=4).to(dtype)
    apply_attention(model, AttentionChoice(str(dtype).removeprefix("torch."), path))
    runner = LayerwiseRunner(model)
    prompt = [5, 17, 3, 42, 8, 23, 11, 2, 9, 30, 12, 7, 19, 4, 33, 21]
    kv = KVPattern(1, 4, 2)
    calls = {"scores": 0, "pillars": 0}
    loader = "load_amx_kernel" if path == KERNEL_AMX_ATTENTION else "load_kernel"
    original = getattr(native_attention, loader)(*([] if path == KERNEL_AMX_ATTENTION else [dtype])).function

    def counting(*args):
        calls["pillars"] += bool(args[15])  # extra keys (the kernels' signature, `_SIGNATURE`)
        calls["scores"] += bool(args[18])
        return original(*args)

    with mock.patch.object(native_attention, loader, lambda *_: NativeLibrary(counting, "")):
        result = speculative_decode(runner, prompt, SkipMask(3), 24, gamma=3, kv=kv)
    assert calls["scores"] > 0 and calls["pillars"] > 0
    assert result.tokens == autoregressive_decode(runner, prompt, 24).tokens


def test_a_gather_copies_each_heads_pillar_rows_out_of_a_growing_caches_view() -> None:
    """The cache exposes its filled part as a view of a longer buffer (`GrowingLayer`): the gathered
    keys and values are each K/V head's chosen rows, contiguous, as the decode kernel reads them."""
    generator = torch.Generator().manual_seed(5)
    buffers = [torch.randn(1, 3, 400, 8, generator=generator) for _ in "kv"]
    key, value = (buffer.narrow(2, 0, 250) for buffer in buffers)
    chosen = torch.stack([torch.randperm(240, generator=generator)[:6].sort().values + 4 for _ in range(3)])
    cache = type("Cache", (), {"layers": [type("Layer", (), {"keys": key, "values": value})()]})()
    keys, values = PillarKeys.gather(KVPattern(4, 16, 6), [chosen], cache).of_layer(0)
    for gathered, source in ((keys, key), (values, value)):
        assert gathered.shape == (1, 3, 6, 8) and gathered.is_contiguous()
        for head in range(3):
            assert torch.equal(gathered[0, head], source[0, head, chosen[head]])
