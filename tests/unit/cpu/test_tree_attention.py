"""Token trees on the CPU backend: the float32 decode-attention kernel reads a tree's rows
(`kv.tree_keys`: each row's ancestors as bits) as SDPA reads the same dense mask, with and without
a KV pattern's sink and window; the fused layers run a tree's passes through it, and greedy tree
decoding on them is lossless, with and without a KV pattern."""

import pytest
import torch
import torch.nn.functional as F

from skipsearch.cpu.decode_attention import decode_attention, load_kernel
from skipsearch.cpu.fused_driver import FusedLayer
from skipsearch.cpu.fused_layers import fuse_layers
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.engine.tree_rounds import tree_decode, tree_mask
from skipsearch.errors import ConfigError
from skipsearch.kv.tree_keys import TreeKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.tree_shapes import TreeShape, parse_tree
from tests.conftest import tiny_model
from tests.unit.cpu.test_fused_layers import LAYERS, needs_kernels, on_the_plan

needs_fp32_kernel = pytest.mark.skipif(
    load_kernel(torch.float32).function is None, reason=str(load_kernel(torch.float32).reason)
)
PROMPT = list(range(3, 60))


def _sdpa(query, key, value, tree: TreeKeys) -> torch.Tensor:
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=tree.dense, scale=0.125, enable_gqa=True
    )
    return out.transpose(1, 2)


@needs_fp32_kernel
@pytest.mark.parametrize("shape", ["2x1", "2x2x1", "3x3x1", "4x2"])
@pytest.mark.parametrize("length", [40, 700, 2500])
@pytest.mark.parametrize("pattern", [None, KVPattern(4, 64), KVPattern(0, 9)], ids=str)
def test_the_kernel_reads_a_tree_as_sdpa_reads_its_mask(shape: str, length: int, pattern) -> None:
    """The verify's block (every node, where it fits the kernel's 16 rows), the leaves' tail block
    and depth 1's draft rows, rooted `length` slots into the cache."""
    tree_shape = TreeShape.parse(shape)
    fed = tree_shape.verify_rows - tree_shape.leaves
    blocks = [range(fed, tree_shape.verify_rows), range(1, 1 + tree_shape.per_depth[0])]
    if tree_shape.verify_rows <= 16:
        blocks.append(range(tree_shape.verify_rows))
    generator = torch.Generator().manual_seed(length)
    for rows in blocks:
        keys = length + rows.stop
        # the cache's buffers are longer than the filled part, as `GrowingLayer`'s views are
        key, value = (torch.randn(1, 2, keys + 24, 64, generator=generator)[:, :, :keys] for _ in "kv")
        query = (3 * torch.randn(1, len(rows), 6, 64, generator=generator)).transpose(1, 2)
        tree = tree_mask(tree_shape, length, rows, keys, torch.device("cpu"), pattern)
        assert tree is not None and tree.base == length
        sink, window = (pattern.sink, pattern.window) if pattern else (0, 0)
        out = decode_attention(query, key, value, 0.125, sink, window, tree=(tree.bits, tree.base))
        expected = _sdpa(query, key, value, tree)
        assert out is not None
        assert torch.allclose(out, expected, rtol=1e-5, atol=1e-5), (rows, (out - expected).abs().max())


@needs_fp32_kernel
def test_a_causal_tree_gets_the_causal_kernel_bits() -> None:
    """Bits that spell causality (row i sees slots 0..i of the block) give the causal call's output
    bit for bit: the tree path changes which keys a row sees, not how it sums them."""
    generator = torch.Generator().manual_seed(3)
    key, value = (torch.randn(1, 2, 900, 64, generator=generator) for _ in "kv")
    query = torch.randn(1, 4, 5, 64, generator=generator)
    bits = torch.tensor([(1 << (i + 1)) - 1 for i in range(5)], dtype=torch.int32)
    assert torch.equal(decode_attention(query, key, value, 0.125, tree=(bits, 895)),
                       decode_attention(query, key, value, 0.125))  # fmt: skip


@needs_fp32_kernel
def test_the_kernel_declines_a_tree_it_cannot_hold() -> None:
    """More than 32 slots from the tree's base, a base past the block's first row, bits of another
    length or dtype: declined (None), so the caller keeps a path that reads the mask."""
    key, value = (torch.randn(1, 1, 100, 64) for _ in "kv")
    query = torch.randn(1, 1, 3, 64)
    bits = torch.tensor([1, 3, 5], dtype=torch.int32)
    assert decode_attention(query, key, value, 0.125, tree=(bits, 97)) is not None
    assert decode_attention(query, key, value, 0.125, tree=(bits, 60)) is None  # 40 slots
    assert decode_attention(query, key, value, 0.125, tree=(bits, 98)) is None  # the base after row 0
    assert decode_attention(query, key, value, 0.125, tree=(bits[:2], 97)) is None
    assert decode_attention(query, key, value, 0.125, tree=(bits.long(), 97)) is None
    with pytest.raises(ValueError, match="32"):
        TreeKeys.build(0, [[33]], [0], 40, torch.device("cpu"))


@needs_kernels
@pytest.mark.parametrize("shape", ["2x1", "2x2x1", "3x1x1", "n8d3k2"])
@pytest.mark.parametrize("pattern", [None, KVPattern(2, 12)], ids=str)
def test_tree_passes_run_fused_and_decode_losslessly(monkeypatch: pytest.MonkeyPatch, shape, pattern) -> None:
    """Every attention of a tree round runs on the fused layers (none falls back to the modules),
    and greedy tree decoding equals autoregressive decoding, under a KV pattern too."""
    model = on_the_plan("llama")
    assert fuse_layers(model) == LAYERS
    runner = LayerwiseRunner(model)
    expected = autoregressive_decode(runner, PROMPT, 24).tokens
    taken, original = [], FusedLayer.takes

    def recorded(self, hidden, cache, choice, tree=None):
        answer = original(self, hidden, cache, choice, tree)
        if tree is not None:
            taken.append(answer)
        return answer

    monkeypatch.setattr(FusedLayer, "takes", recorded)
    mask = SkipMask.from_layers(LAYERS, [2])
    result = tree_decode(runner, PROMPT, mask, parse_tree(shape), 24, timed=False, kv=pattern)
    assert result.tokens == expected
    assert taken and all(taken), f"{taken.count(False)} of {len(taken)} tree passes left the fused layers"


@needs_kernels
def test_a_width_one_tree_under_a_kv_pattern_is_the_chain() -> None:
    model = on_the_plan("qwen2")
    fuse_layers(model)
    runner = LayerwiseRunner(model)
    mask, pattern = SkipMask.from_layers(LAYERS, [1]), KVPattern(2, 8)
    chain = speculative_decode(runner, PROMPT, mask, 24, gamma=3, kv=pattern)
    tree = tree_decode(runner, PROMPT, mask, TreeShape.chain(3), 24, kv=pattern)
    assert tree.tokens == chain.tokens
    assert tree.accepted == chain.accepted and tree.gammas == chain.gammas


def test_a_tree_refuses_pillars_and_a_window_it_outgrows() -> None:
    runner = LayerwiseRunner(tiny_model("llama"))
    mask = SkipMask.from_layers(runner.num_layers, [1])
    with pytest.raises(ConfigError, match="not pillars"):
        tree_decode(runner, PROMPT, mask, TreeShape.parse("2x1"), 4, kv=KVPattern(2, 8, 4))
    with pytest.raises(ConfigError, match="window of 2"):
        tree_decode(runner, PROMPT, mask, TreeShape.parse("2x1x1"), 4, kv=KVPattern(2, 2))
