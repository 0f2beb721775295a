"""Draft weights at lower precision: the swapped modules share everything but their projections, a
masked pass equals the model with its matrices replaced by their dequantized copies, the cache file is
written once and read back bit for bit, and copies that would not fit are refused in one line."""

import copy

import pytest
import torch

from skipsearch.cpu.int_linear import Int4Linear, Int8Linear
from skipsearch.cpu.int_weights import dequantize_int4, dequantize_int8, quantize_int4, quantize_int8
from skipsearch.errors import ConfigError
from skipsearch.masks import SkipMask
from skipsearch.models import draft_weights
from skipsearch.models.draft_weights import (
    ATTN,
    MLP,
    DraftWeights,
    draft_weights_of,
    group_for,
    quantized_bytes,
    remember_checkpoint,
    set_int4_group,
)
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

LAYERS = 4


@pytest.fixture
def model():
    return tiny_model("llama", layers=LAYERS, seed=3)


def test_int4_groups_are_32_unless_asked_for_another_that_divides_the_inputs() -> None:
    assert group_for(1536) == 32 and group_for(576) == 32 and group_for(96) == 32
    assert group_for(576, 64) == 64
    with pytest.raises(ConfigError, match="groups of 128 do not fit a matrix of 576 inputs"):
        group_for(576, 128)


def test_a_swapped_module_shares_all_but_its_projections(model) -> None:
    weights = DraftWeights(model)
    attention, mlp = weights.self_attn(1, 8), weights.mlp(1, 4)
    original = model.model.layers[1]
    assert type(attention.q_proj) is Int8Linear and type(mlp.down_proj) is Int4Linear
    assert type(original.self_attn.q_proj) is torch.nn.Linear  # the model's own module is untouched
    assert attention.layer_idx == original.self_attn.layer_idx  # writes the same cache layer
    assert weights.self_attn(1, 8) is attention  # built once
    assert mlp.act_fn is original.mlp.act_fn


def test_a_masked_pass_is_the_model_with_dequantized_matrices(model) -> None:
    """Every projection at int8 (int4 in layer 2's MLP): the runner's logits are the model's with
    each matrix replaced by the matrix its copy stands for, up to float32 reassociation."""
    runner = LayerwiseRunner(model)
    mask = SkipMask.parse(f"w8:0-{LAYERS - 1}", LAYERS)
    mask = SkipMask(LAYERS, attn_int8=mask.attn_int8, mlp_int8=mask.mlp_int8 - {2}, mlp_int4=[2])
    ids = torch.tensor([[5, 17, 3, 42, 8]])
    got = runner.forward(ids, mask)
    reference = copy.deepcopy(model)
    with torch.no_grad():
        for layer, block in enumerate(reference.model.layers):
            for module in (block.self_attn, block.mlp):
                for child in module.children():
                    if isinstance(child, torch.nn.Linear):
                        w = child.weight
                        int4 = module is block.mlp and layer == 2
                        child.weight.copy_(
                            dequantize_int4(quantize_int4(w, group_for(w.shape[1])))
                            if int4
                            else dequantize_int8(quantize_int8(w))
                        )
    expected = reference(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(got, runner.forward(ids), atol=1e-4)  # the copies differ from the model


def test_the_bytes_are_stated_and_copies_that_do_not_fit_are_refused(model, monkeypatch) -> None:
    weights = DraftWeights(model)
    mask = SkipMask.parse("w8a:0|w4m:1", LAYERS)
    hidden, inner = 32, 64  # tests.conftest.TINY; 4 heads of 8, 2 K/V heads
    attention = quantized_bytes(hidden, hidden, 8, 0) * 2 + quantized_bytes(16, hidden, 8, 0) * 2
    mlp = quantized_bytes(inner, hidden, 4, 32) * 2 + quantized_bytes(hidden, inner, 4, 32)
    assert weights.nbytes(mask) == attention + mlp
    monkeypatch.setattr(draft_weights, "available_memory", lambda: attention + mlp - 1)
    with pytest.raises(ConfigError, match=r"draft weights of .* need 0 MB but 0 MB of memory are available"):
        weights.prepare(mask)
    assert weights.loaded_bytes == 0
    monkeypatch.setattr(draft_weights, "available_memory", lambda: attention + mlp)
    weights.prepare(mask)
    assert weights.loaded_bytes == attention + mlp


def test_runners_of_one_model_share_its_draft_weights_at_the_group_set_for_it(model) -> None:
    assert LayerwiseRunner(model).draft_weights is LayerwiseRunner(model).draft_weights
    assert draft_weights_of(model, 32) is not draft_weights_of(model)
    assert LayerwiseRunner(model).draft_weights.mlp(0, 4).down_proj.group == 32
    set_int4_group(model, 32)
    assert LayerwiseRunner(model).draft_weights is draft_weights_of(model, 32)
    assert LayerwiseRunner(model).draft_weights.mlp(0, 4).down_proj.group == 32
    with pytest.raises(ConfigError, match="groups of 64 do not fit a matrix of 32 inputs"):
        set_int4_group(model, 64)


def test_a_checkpoints_copies_are_written_once_and_read_back_bit_for_bit(
    model, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path))
    in_memory = DraftWeights(model)
    remember_checkpoint(model, "/models/tiny")
    cached = DraftWeights(model)
    mask = SkipMask.parse("w4:1|w8m:3", LAYERS)
    cached.prepare(mask)
    files = list((tmp_path / "draft_weights").iterdir())
    names = sorted(f.name for f in files)
    assert (
        len(names) == 2
        and names[0].endswith("-int4-g32-v2.safetensors")
        and names[1].endswith("-int8-v2.safetensors")
    )
    written = {f: f.stat().st_mtime_ns for f in files}
    again = DraftWeights(model)
    again.prepare(mask)
    assert {f: f.stat().st_mtime_ns for f in (tmp_path / "draft_weights").iterdir()} == written
    for layer, kind, bits in DraftWeights.used(mask):
        for source in (cached, again):
            module = source._module(layer, kind, bits)
            expected = in_memory._module(layer, kind, bits)
            for name, child in module.named_children():
                if isinstance(child, (Int8Linear, Int4Linear)):
                    torch.testing.assert_close(child.weight, getattr(expected, name).weight, rtol=0, atol=0)


def test_a_half_precision_model_gets_plain_layers_holding_the_dequantized_matrices() -> None:
    """Our kernels take float32 activations: a bf16 model's copies are linear layers in bf16 holding
    what the quantized weights stand for (the draft's numerics, not its bytes)."""
    model = tiny_model("llama", layers=2, seed=3).to(torch.bfloat16)
    runner = LayerwiseRunner(model)
    linear = runner.draft_weights.mlp(1, 8).up_proj
    original = model.model.layers[1].mlp.up_proj.weight
    assert type(linear) is torch.nn.Linear and linear.weight.dtype == torch.bfloat16
    expected = dequantize_int8(quantize_int8(original)).to(torch.bfloat16)
    torch.testing.assert_close(linear.weight, expected, rtol=0, atol=0)
    logits = runner.forward(torch.tensor([[5, 17, 3]]), SkipMask.parse("w8:0-1", 2))
    assert logits.dtype == torch.bfloat16


def fused_draft(bits: int) -> tuple:
    """A tiny Llama on the plan with fused layers, its runner prepared for every layer at `bits`
    (skipped where the fused layers' kernels do not load): (model, runner, mask, layers)."""
    from skipsearch.cpu import int_linear
    from skipsearch.cpu.fused_layers import fuse_layers
    from tests.unit.cpu.test_fused_layers import KERNELS, LAYERS, on_the_plan

    kind = int_linear.INT8 if bits == 8 else int_linear.INT4
    if any(kernel.function is None for kernel in KERNELS) or not int_linear.builds(kind):
        pytest.skip("the fused layers' kernels do not load here")
    model = on_the_plan("llama")
    fuse_layers(model)
    runner = LayerwiseRunner(model)
    mask = SkipMask.parse(f"w{bits}:0-{LAYERS - 1}", LAYERS)
    runner.prepare(mask)
    return model, runner, mask, LAYERS


@pytest.mark.parametrize("bits", [8, 4])
def test_where_the_plan_fuses_layers_the_draft_runs_fused_on_its_own_copies(bits: int) -> None:
    """The runner's draft at `bits` runs each sub-layer in the fused driver (`DraftWeights.fused`,
    over the copies its modules hold: what the engine and the latency profile time), with their bits."""
    from skipsearch.cpu.fused_layers import LowerPrecisionLayer

    model, runner, mask, LAYERS = fused_draft(bits)
    fused = [runner.fused_at(layer, bits, part) for layer in range(LAYERS) for part in (ATTN, MLP)]
    assert all(isinstance(layer, LowerPrecisionLayer) for layer in fused)
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    drafted = runner.forward(ids, mask)
    runner.fused = [None] * LAYERS  # the same copies through the modules
    assert torch.equal(drafted, runner.forward(ids, mask))


@pytest.mark.parametrize("bits", [8, 4])
def test_a_draft_run_fused_holds_its_packed_bytes_once(bits: int) -> None:
    """Once a draft's sub-layers run fused (as a decode runs them), its modules' int kernels read
    their rows of the fused layers' copy: the draft's tensors hold its packed bytes (`nbytes`), not
    twice them, and the modules give the fused layers' bits."""
    model, runner, mask, LAYERS = fused_draft(bits)
    weights = runner.draft_weights
    packed = weights.nbytes(mask)
    assert weights.held_bytes() == packed  # the modules' copies alone
    for layer in range(LAYERS):
        for part in (ATTN, MLP):
            assert runner.fused_at(layer, bits, part) is not None
    assert weights.held_bytes() == packed  # and the fused layers' beside them: one copy
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(4))
    drafted = runner.forward(ids, mask)
    runner.fused = [None] * LAYERS
    assert torch.equal(drafted, runner.forward(ids, mask))
