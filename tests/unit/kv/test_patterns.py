"""Attention over a KV pattern (`kv.patterns`): SDPA over the sink and each query's window."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from skipsearch.errors import ConfigError
from skipsearch.kv.patterns import StaticKeys, pattern_attention, static_pattern_attention
from skipsearch.masks import KVPattern
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model, with_plan_attention


def band_mask(pattern: KVPattern, queries: int, keys: int) -> torch.Tensor:
    """What query i (at position keys - queries + i) may see: the sink and its window."""
    at = torch.arange(keys - queries, keys)[:, None]
    key = torch.arange(keys)[None]
    return (key <= at) & ((key < pattern.sink) | (key > at - pattern.window))


@pytest.mark.parametrize("queries", [1, 4])
@pytest.mark.parametrize("pattern", [KVPattern(4, 16), KVPattern(0, 8), KVPattern(3, 30)], ids=str)
def test_pattern_attention_is_sdpa_over_the_sink_and_each_querys_window(
    queries: int, pattern: KVPattern
) -> None:
    generator = torch.Generator().manual_seed(0)
    heads, kv_heads, keys, dim = 6, 2, 40, 8
    query = torch.randn(1, heads, queries, dim, generator=generator)
    key, value = (torch.randn(1, kv_heads, keys, dim, generator=generator) for _ in "kv")
    out = pattern_attention(query, key, value, pattern, dim**-0.5)
    expected = F.scaled_dot_product_attention(
        query, key, value, attn_mask=band_mask(pattern, queries, keys), enable_gqa=True
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_a_pattern_that_covers_the_context_leaves_attention_to_the_model() -> None:
    query, key = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 20, 4)
    assert pattern_attention(query, key, key, KVPattern(4, 16), 0.5) is None
    assert pattern_attention(query, key, key, KVPattern(4, 15), 0.5) is not None


def test_a_kv_pattern_changes_a_long_prompts_logits_and_not_a_short_ones() -> None:
    runner = LayerwiseRunner(with_plan_attention(tiny_model(layers=3)))
    ids = torch.randint(3, 61, (1, 30), generator=torch.Generator().manual_seed(2))
    at = torch.arange(30)[None]

    def last_logits(length: int, kv: KVPattern | None) -> torch.Tensor:
        hidden = runner.run_layers(runner.embed(ids[:, :length]), 0, 3, at[:, :length], kv=kv)
        return runner.head(hidden)[0, -1]

    torch.testing.assert_close(last_logits(10, KVPattern(2, 8)), last_logits(10, None))
    assert not torch.allclose(last_logits(30, KVPattern(2, 8)), last_logits(30, None))


def test_a_kv_pattern_on_an_attention_that_ignores_it_is_refused() -> None:
    runner = LayerwiseRunner(tiny_model(layers=2))  # transformers' own SDPA would attend to every key
    with pytest.raises(ConfigError, match="kernel plan's attention"):
        runner.run_layers(
            runner.embed(torch.tensor([[3, 4]])), 0, 2, torch.arange(2)[None], kv=KVPattern(1, 1)
        )


@pytest.mark.parametrize("pattern", [KVPattern(2, 5), KVPattern(0, 3), KVPattern(4, 40)], ids=str)
@pytest.mark.parametrize("position", [0, 3, 9, 30])
def test_the_static_window_reads_the_keys_the_slice_reads(pattern: KVPattern, position: int) -> None:
    """Over a static buffer of 40 slots (stale beyond the position), gathered from the position on
    the device: the sliced attention over the first `position + 1` slots, to float rounding."""
    generator = torch.Generator().manual_seed(position)
    query = torch.randn(1, 6, 1, 8, generator=generator)
    key, value = (torch.randn(1, 2, 40, 8, generator=generator) for _ in range(2))
    keys = StaticKeys(pattern, torch.tensor([[position]]))
    got = static_pattern_attention(query, key, value, keys, 8**-0.5)
    cut = (key[:, :, : position + 1], value[:, :, : position + 1])
    expected = pattern_attention(query, *cut, pattern, 8**-0.5)
    if expected is None:  # the pattern covers the context: plain attention over it
        expected = F.scaled_dot_product_attention(
            query, cut[0].repeat_interleave(3, 1), cut[1].repeat_interleave(3, 1)
        ).transpose(1, 2)
    torch.testing.assert_close(got, expected)
