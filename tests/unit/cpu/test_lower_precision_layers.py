"""The fused decoder layers at int8 and int4 (`cpu.fused_layers.lower_precision_layer`): the bits
of the block's modules with `Int8Linear`/`Int4Linear` projections on the same quantized weights, in
every pass the engine makes, in both builds of the int kernels; a verify's rows the draft steps'
bits; the block's own bf16 fused path untouched."""

import os

import pytest
import torch

from skipsearch.cpu import fused_layers, int_linear, shared_core
from skipsearch.cpu.bf16_weights import VECTOR
from skipsearch.cpu.fused_layers import (
    ATTENTION,
    MLP,
    LowerPrecisionLayer,
    fuse_layers,
    lower_precision_layer,
    lower_precision_refusal,
)
from skipsearch.cpu.int_linear import Int4Linear, Int8Linear
from skipsearch.cpu.int_weights import quantize_int4, quantize_int8
from skipsearch.cpu.shared_core import SharedCores
from skipsearch.kv.pillars import PillarKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.runner import LayerwiseRunner
from tests.unit.cpu.test_fused_layers import LAYERS, needs_kernels, on_the_plan

_KIND = {8: int_linear.INT8, 4: int_linear.INT4}
# (bits, width): each int kernel's builds this CPU runs (the AVX2 one as well as the AVX-512 one)
BUILDS = [
    pytest.param(bits, width, id=f"int{bits}-{width}")
    for bits, kind in ((8, int_linear.INT8), (4, int_linear.INT4))
    for width in int_linear.builds(kind)
]


def quantized_modules(family: str, bits: int, width: int, group: int = 32) -> torch.nn.Module:
    """The tiny model on the plan with every projection an `Int8Linear`/`Int4Linear` of its bf16
    weights (the quantization `lower_precision_layer` makes, per output channel or group)."""
    model = on_the_plan(family)
    for block in model.model.layers:
        for owner, names in ((block.self_attn, ("q", "k", "v", "o")), (block.mlp, ("gate", "up", "down"))):
            for name in names:
                projection = getattr(owner, f"{name}_proj")
                weight = projection.weight
                setattr(
                    owner,
                    f"{name}_proj",
                    Int8Linear(weight, projection.bias, width=width)
                    if bits == 8
                    else Int4Linear(weight, projection.bias, group, width=width),
                )
    return model


def lower_precision_runner(model: torch.nn.Module, bits: int, width: int, **kwargs) -> LayerwiseRunner:
    runner = LayerwiseRunner(model)
    runner.fused = [lower_precision_layer(block, bits, width=width, **kwargs) for block in runner.layers]
    assert all(isinstance(layer, LowerPrecisionLayer) for layer in runner.fused)
    return runner


def module_runner(model: torch.nn.Module) -> LayerwiseRunner:
    runner = LayerwiseRunner(model)
    runner.fused = [None] * runner.num_layers
    return runner


def passes(
    runner: LayerwiseRunner, ids: torch.Tensor, family: str
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A prefill (the bf16 model's modules, as a draft's cache is the full model's), then steps and
    verifies of 1..16 rows, draft steps over a sink + window pattern and over pillars: the logits and
    the cache's K/V."""
    pattern = KVPattern(sink=2, window=8, pillars=3)
    cache = runner.new_cache()
    module_runner(on_the_plan(family)).forward(ids[:, :24], cache=cache)
    logits, start = [], 24
    for rows in (1, 16, 3, 1, 7):
        logits.append(runner.forward(ids[:, start : start + rows], cache=cache))
        start += rows
    positions = torch.arange(start, start + 2)[None]
    hidden = runner.run_layers(
        runner.embed(ids[:, start : start + 2]), 0, LAYERS, positions, cache=cache, kv=pattern
    )
    logits.append(runner.head(hidden))
    chosen = [
        torch.tensor([[0, 5, 20]] * 2),
        None,
        torch.tensor([[1, 2, 3]] * 2),
        torch.tensor([[9, 4, 7]] * 2),
    ]
    reads = PillarKeys.gather(pattern, chosen, cache)
    hidden = runner.run_layers(
        runner.embed(ids[:, start + 2 : start + 3]), 0, LAYERS, positions[:, :1] + 2, cache=cache, kv=reads
    )
    logits.append(runner.head(hidden))
    kv = [
        buffer[:, :, : start + 3].clone() for layer in cache.layers for buffer in (layer.keys, layer.values)
    ]
    return logits, kv


@needs_kernels
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(("bits", "width"), BUILDS)
def test_lower_precision_layers_compute_the_int_modules_bits(family: str, bits: int, width: int) -> None:
    """Every pass's logits and K/V equal the modules' with the int projections bit for bit (each
    product's outputs are `Int8Linear`/`Int4Linear`'s bits: the tolerance is zero)."""
    model = on_the_plan(family)
    ids = torch.randint(0, model.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(0))
    fused_logits, fused_kv = passes(lower_precision_runner(model, bits, width), ids, family)
    module_logits, module_kv = passes(module_runner(quantized_modules(family, bits, width)), ids, family)
    assert all(torch.equal(f, m) for f, m in zip(fused_logits, module_logits, strict=True))
    assert all(torch.equal(f, m) for f, m in zip(fused_kv, module_kv, strict=True))
    # and not the bf16 model's: the products did change
    bf16_logits, _ = passes(module_runner(on_the_plan(family)), ids, family)
    assert not torch.equal(fused_logits[0], bf16_logits[0])


@needs_kernels
@pytest.mark.parametrize(("bits", "width"), BUILDS)
def test_a_verify_is_the_draft_steps_bits(bits: int, width: int) -> None:
    """The same positions one row a call and in blocks of 2..16 rows: the same logits, bit for bit."""
    model = on_the_plan("qwen2")
    runner = lower_precision_runner(model, bits, width)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(2))
    cache = runner.new_cache()
    runner.forward(ids[:, :20], cache=cache)
    steps = torch.cat([runner.forward(ids[:, p : p + 1], cache=cache) for p in range(20, 36)], dim=1)
    for rows in (2, 5, 16):
        cache = runner.new_cache()
        runner.forward(ids[:, :20], cache=cache)
        blocks = [runner.forward(ids[:, p : min(p + rows, 36)], cache=cache) for p in range(20, 36, rows)]
        assert torch.equal(torch.cat(blocks, dim=1), steps)


@needs_kernels
@pytest.mark.parametrize("part", [ATTENTION, MLP])
def test_one_sub_layer_kind_at_lower_precision(part: str) -> None:
    """A layer of only one part holds only that part's weights and refuses the other; beside the
    bf16 fused path's other half it computes the modules' bits with only that part's projections
    quantized."""
    bits, width = 8, next(iter(int_linear.builds(int_linear.INT8)))
    model = on_the_plan("llama")
    fuse_layers(model)
    runner = LayerwiseRunner(model)
    halves = [lower_precision_layer(block, bits, parts=(part,), width=width) for block in runner.layers]
    whole = lower_precision_layer(runner.layers[0], bits, width=width)
    assert 0 < halves[0].packed_bytes() < whole.packed_bytes()
    hidden = torch.randn(1, 3, model.config.hidden_size)
    with pytest.raises(ValueError, match="holds no"):
        halves[0].mlp(hidden) if part == ATTENTION else halves[0].attention(hidden, None, None)
    # the modules with only `part`'s projections quantized
    reference = on_the_plan("llama")
    for block in reference.model.layers:
        owner, names = (block.self_attn, "qkvo") if part == ATTENTION else (block.mlp, ("gate", "up", "down"))
        for name in names:
            projection = getattr(owner, f"{name}_proj")
            setattr(owner, f"{name}_proj", Int8Linear(projection.weight, projection.bias, width=width))
    for layer, half in zip(runner.fused, halves, strict=True):  # the bf16 fused path, `part` at int8
        setattr(layer, part, getattr(half, part))
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(4))
    outputs, prefill = [], module_runner(on_the_plan("llama"))
    for each in (runner, module_runner(reference)):
        cache = each.new_cache()
        prefill.forward(ids[:, :20], cache=cache)
        outputs.append([each.forward(ids[:, p : p + 3], cache=cache) for p in range(20, 29, 3)])
    assert all(torch.equal(a, b) for a, b in zip(*outputs, strict=True))


@needs_kernels
def test_the_blocks_own_fused_path_is_untouched() -> None:
    """Building lower-precision layers changes nothing the block's bf16 fused path computes."""
    model = on_the_plan("llama")
    fuse_layers(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(5))
    runner = LayerwiseRunner(model)

    def decode() -> list[torch.Tensor]:
        cache = runner.new_cache()
        return [runner.forward(ids[:, :20], cache=cache), runner.forward(ids[:, 20:24], cache=cache)]

    before = decode()
    layers = [lower_precision_layer(block, bits) for block in runner.layers for bits in (8, 4)]
    assert all(layer is not None for layer in layers)
    assert all(torch.equal(a, b) for a, b in zip(decode(), before, strict=True))
    assert all(fused_layers.fused_layer(block) is not layer for block in runner.layers for layer in layers)


@needs_kernels
def test_the_quantized_copy_its_bytes_and_refusals() -> None:
    model = on_the_plan("llama")
    block = model.model.layers[0]
    config = model.config
    hidden, inner = config.hidden_size, config.intermediate_size
    q_width = config.num_attention_heads * (hidden // config.num_attention_heads)
    kv_width = config.num_key_value_heads * (hidden // config.num_attention_heads)
    weights = (q_width + 2 * kv_width) * hidden + hidden * q_width + 2 * inner * hidden + hidden * inner
    width = next(iter(int_linear.builds(int_linear.INT8)))
    int8 = lower_precision_layer(block, 8, width=width)
    # one byte a weight (padded to whole blocks and chunks), a float32 scale an output
    assert (
        weights
        <= int8.packed_bytes()
        <= weights * 1.1 + 4 * (q_width + 2 * kv_width + 2 * hidden + 2 * inner)
    )
    int4 = lower_precision_layer(block, 4, width=width)
    assert int4.group == 32  # the smallest group size dividing 64 and 128 inputs
    assert weights / 2 <= int4.packed_bytes() < int8.packed_bytes()
    # the quantized values are int_weights' of the bf16 weights
    q_proj = block.self_attn.q_proj
    packed, scale, _ = int8.products["qkv"]
    assert torch.equal(scale[:q_width], quantize_int8(q_proj.weight).scale)
    assert torch.equal(int_linear.unpack_int8(packed, q_width, hidden), quantize_int8(q_proj.weight).q)
    words, params, _ = int4.products["down"]
    unpacked = int_linear.unpack_int4(words, params, hidden, inner, 32, width)
    assert torch.equal(unpacked.q, quantize_int4(block.mlp.down_proj.weight, 32).q)
    assert lower_precision_refusal(block, 4, group=128) is not None  # 64 inputs are no whole group of 128
    assert lower_precision_layer(block, 4, group=128) is None
    assert lower_precision_refusal(block, 8) is None
    plain = on_the_plan("llama")
    plain.model.layers[0].self_attn.q_proj = torch.nn.Linear(hidden, q_width)  # not the plan's product
    assert "FusedLayer.fits" in lower_precision_refusal(plain.model.layers[0], 8)
    with pytest.raises(ValueError):
        lower_precision_layer(block, 5)


@needs_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_a_draft_on_shared_cores_is_the_same_bits(monkeypatch: pytest.MonkeyPatch, bits: int) -> None:
    """With helpers engaged on a busy core (`cpu.shared_core`, a piece held and taken back) the
    fused int products inside the driver give the bits they give alone."""
    model = on_the_plan("llama")
    runner = lower_precision_runner(model, bits, next(iter(int_linear.builds(_KIND[bits]))))
    ids = torch.randint(0, model.config.vocab_size, (1, 30), generator=torch.Generator().manual_seed(6))

    def draft() -> list[torch.Tensor]:
        cache = runner.new_cache()
        runner.forward(ids[:, :20], cache=cache)
        return [runner.forward(ids[:, p : p + 1], cache=cache) for p in range(20, 30)]

    alone = draft()
    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.setattr(shared_core, "_plan", SharedCores(cores[0], (cores[-1],), VECTOR))
    library = int_linear.builds(_KIND[bits])[runner.fused[0].width]
    with shared_core.engaged() as on:
        assert on
        shared_core.hold_next_piece(library, 2000)
        assert all(torch.equal(a, b) for a, b in zip(draft(), alone, strict=True))


@needs_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_given_quantized_weights_are_the_ones_read(bits: int) -> None:
    """A draft's own quantized copies (by projection name) give the layer it would quantize itself
    at the same group, buffer for buffer; weights that do not fit are refused with the reason."""
    block = on_the_plan("qwen2").model.layers[1]
    names = {"self_attn": ("q", "k", "v", "o"), "mlp": ("gate", "up", "down")}
    given = {
        f"{name}_proj": (quantize_int8 if bits == 8 else lambda w: quantize_int4(w, 32))(
            getattr(getattr(block, owner), f"{name}_proj").weight
        )
        for owner, projections in names.items()
        for name in projections
    }
    from_given = lower_precision_layer(block, bits, quantized=given)
    own = lower_precision_layer(block, bits, group=32 if bits == 4 else None)
    assert from_given.group == own.group
    for name, buffers in own.products.items():
        assert all(
            (a is None and b is None) or torch.equal(a, b)
            for a, b in zip(buffers, from_given.products[name], strict=True)
        )
    attention_only = {name: weight for name, weight in given.items() if name[0] in "qkvo"}
    assert lower_precision_layer(block, bits, parts=(ATTENTION,), quantized=attention_only) is not None
    assert "no int" in lower_precision_refusal(block, bits, quantized=attention_only)  # the MLP's missing
    wrong = {**given, "o_proj": quantize_int8(block.self_attn.q_proj.weight[:8])}
    assert lower_precision_refusal(block, bits, quantized=wrong) is not None
    if bits == 4:
        mixed = {**given, "down_proj": quantize_int4(block.mlp.down_proj.weight, 64)}
        assert "one group size" in lower_precision_refusal(block, 4, quantized=mixed)


@needs_kernels
@pytest.mark.parametrize("bits", [8, 4])
def test_a_lower_precision_draft_runs_its_layers_fused_with_the_modules_bits(bits: int) -> None:
    """On a plan that fuses its layers, the draft's int8/int4 sub-layers run in the fused driver
    (`LayerwiseRunner.fused_at`), not the modules' Python, and give the modules' bits."""
    model = on_the_plan("llama")
    assert fuse_layers(model) == LAYERS
    fused, modules = LayerwiseRunner(model), LayerwiseRunner(model)
    mask = SkipMask.parse(f"w{bits}:0-{LAYERS - 1}", LAYERS)
    fused.prepare(mask)
    for layer in range(LAYERS):
        for kind in ("attn", "mlp"):
            assert isinstance(fused.fused_at(layer, bits, kind), LowerPrecisionLayer), (layer, kind)
    modules.fused = [None] * LAYERS
    ids = torch.tensor([[3, 17, 5, 9, 30, 2]])
    caches = fused.new_cache(), modules.new_cache()
    out = [
        runner.forward(ids[:, :5], mask, cache)
        for runner, cache in zip((fused, modules), caches, strict=True)
    ]
    torch.testing.assert_close(out[0], out[1], rtol=0, atol=0)
    step = [
        runner.forward(ids[:, 5:], mask, cache)
        for runner, cache in zip((fused, modules), caches, strict=True)
    ]
    torch.testing.assert_close(step[0], step[1], rtol=0, atol=0)
