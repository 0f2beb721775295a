"""The plan's KV cache: appends in place hold what transformers' own layer holds."""

import torch
from transformers.cache_utils import DynamicLayer

from skipsearch.kv.plan_kv import MIN_CAPACITY, GrowingLayer


def test_a_growing_layer_holds_what_transformers_layer_holds_through_appends_and_crops() -> None:
    """Appends past the first capacity, crops back, appends over the rolled-back positions."""
    generator = torch.Generator().manual_seed(0)
    growing, plain = GrowingLayer(), DynamicLayer()
    for step, (add, cut) in enumerate([(200, 0), (3, -2), (100, 0), (1, -1), (4, -3), (60, 0)]):
        keys = torch.randn(1, 2, add, 8, generator=generator)
        values = torch.randn(1, 2, add, 8, generator=generator)
        got, want = growing.update(keys, values), plain.update(keys, values)
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), step
        growing.crop(cut), plain.crop(cut)
        assert growing.get_seq_length() == plain.get_seq_length()
        assert torch.equal(growing.keys, plain.keys) and torch.equal(growing.values, plain.values)
    assert growing._keys.shape[2] >= 2 * MIN_CAPACITY  # grew by doubling


def test_a_growing_layer_stores_its_own_dtype() -> None:
    layer = GrowingLayer(torch.float32)
    keys = torch.randn(1, 2, 3, 8).bfloat16()
    stored, _ = layer.update(keys, keys)
    assert stored.dtype == torch.float32 and torch.equal(stored, keys.float())


def test_a_claim_makes_room_that_the_caller_fills() -> None:
    """The fused layers write rotated keys straight into the buffers: a claim past the capacity
    grows them, keeps what was cached, and exposes the claimed positions."""
    layer = GrowingLayer(torch.float32)
    cached = torch.randn(1, 2, MIN_CAPACITY - 1, 8)
    layer.update(cached, cached)
    start = layer.claim(3)
    keys, values = layer.buffers
    keys[:, :, start : start + 3] = 1.0
    values[:, :, start : start + 3] = 2.0
    assert start == MIN_CAPACITY - 1 and layer.get_seq_length() == MIN_CAPACITY + 2
    assert keys.shape[2] >= MIN_CAPACITY + 2 and layer.keys.shape[2] == MIN_CAPACITY + 2
    assert torch.equal(layer.keys[:, :, :start], cached) and bool((layer.keys[:, :, start:] == 1.0).all())
    assert bool((layer.values[:, :, start:] == 2.0).all())
