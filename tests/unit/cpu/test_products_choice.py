"""Which kernel multiplies a model's bf16 weights (`cpu.products_choice`): the rule, the whole-model
passes it times on copies, the fallback without AMX, and a model moved to the tile kernel decoding
losslessly on the fused layers."""

import pytest
import torch

from skipsearch.cpu import products_choice
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import KERNEL_AMX_ATTENTION, KERNEL_FP32_ATTENTION
from skipsearch.cpu.bf16_weights import (
    TILES,
    VECTOR,
    Bf16WeightLinear,
    load_kernel,
    load_tile_kernel,
    use_bf16_weights,
)
from skipsearch.cpu.fused_layers import fuse_layers
from skipsearch.cpu.inventory import plan_kernels
from skipsearch.cpu.native import NativeLibrary
from skipsearch.cpu.products_choice import (
    PROBE_ROWS,
    ProductsChoice,
    choose_products,
    decide,
    measure_steps,
    step_products,
)
from skipsearch.cpu.rms_norm import use_kernel_norms
from skipsearch.cpu.rotary import use_kernel_rotary
from skipsearch.cpu.silu import use_kernel_silu
from skipsearch.models.backend import fallback_kernels
from skipsearch.models.kernels import apply_attention
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import assert_greedy_ssd_lossless, needs_amx_attention, tiny_model

LAYERS = 3


def timings(vector: tuple[float, float], tiles: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {
        VECTOR: dict(zip(map(str, PROBE_ROWS), vector, strict=True)),
        TILES: dict(zip(map(str, PROBE_ROWS), tiles, strict=True)),
    }


@pytest.mark.parametrize(
    ("vector", "tiles", "expected"),
    [
        ((12.17, 15.22), (11.98, 12.75), TILES),  # SmolLM2's steps on the project's Xeon
        ((11.11, 14.16), (11.20, 11.98), TILES),  # 0.8% apart at one row: a tie, the verify decides
        ((12.0, 15.0), (12.3, 12.8), VECTOR),  # 2.5% slower at one row: the baseline would be slower
        ((12.0, 13.0), (12.0, 13.5), VECTOR),  # no gain where a verify runs
    ],
)
def test_tiles_run_only_where_the_step_is_no_slower_and_a_verify_faster(
    vector: tuple[float, float], tiles: tuple[float, float], expected: str
) -> None:
    assert decide(timings(vector, tiles)) == expected


def test_a_steps_products_are_grouped_as_the_fused_layers_call_them() -> None:
    model = tiny_model("llama", layers=LAYERS, hidden_size=64, intermediate_size=128)
    groups = step_products(model)
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert groups[0] == [attention.q_proj, attention.k_proj, attention.v_proj]
    assert groups[2] == [mlp.gate_proj, mlp.up_proj]
    assert len(groups) == 4 * LAYERS + 1 and groups[-1] == [model.lm_head]


def test_without_the_tile_kernel_the_vector_kernel_runs_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        products_choice, "load_tile_kernel", lambda: NativeLibrary(None, "this CPU lacks amx_tile")
    )
    choice = choose_products(tiny_model("llama", layers=1), fallback_kernels, LayerwiseRunner)
    assert choice == ProductsChoice(VECTOR, unavailable="this CPU lacks amx_tile")
    assert (
        choice.describe()
        == "products on skipsearch's vector kernel (AMX kernel not used: this CPU lacks amx_tile)"
    )


def test_a_measured_choice_names_both_kernels_timings() -> None:
    choice = ProductsChoice(TILES, timings((12.17, 15.22), (11.98, 12.75)), "a+b")
    assert choice.describe() == (
        "products on skipsearch's AMX kernel (ms per pass of the model over 1/5 positions: "
        "vector 12.17, 15.22; AMX 11.98, 12.75)"
    )


@pytest.mark.skipif(load_kernel().function is None, reason=f"no vector kernel: {load_kernel().reason}")
def test_the_steps_are_timed_on_copies_built_with_the_rest_of_the_plan() -> None:
    """Each kernel is timed on its own copy of the model, built by the plan's own builder (so the
    fused layers run around it); the model the caller goes on to load is left as it was."""
    model = tiny_model("llama", layers=2, hidden_size=64, intermediate_size=128)
    built: list[tuple[torch.nn.Module, str]] = []

    def build(candidate: torch.nn.Module, kernel: str) -> list[str]:
        built.append((candidate, kernel))
        return fallback_kernels(candidate, kernel)

    measured = measure_steps(model, build, LayerwiseRunner, kernels=(VECTOR,))
    assert [kernel for _, kernel in built] == [VECTOR] and built[0][0] is not model
    assert any(isinstance(m, Bf16WeightLinear) for m in built[0][0].modules())
    assert not any(isinstance(m, Bf16WeightLinear) for m in model.modules())
    assert set(measured[VECTOR]) == {str(rows) for rows in PROBE_ROWS}
    assert all(ms > 0 for ms in measured[VECTOR].values())


@pytest.mark.skipif(load_tile_kernel().function is None, reason=f"no AMX kernel: {load_tile_kernel().reason}")
@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(
    "attention", [KERNEL_FP32_ATTENTION, pytest.param(KERNEL_AMX_ATTENTION, marks=needs_amx_attention)]
)
def test_a_model_on_tiles_fuses_its_layers_and_decodes_losslessly(family: str, attention: str) -> None:
    """On the tile kernel, beside either fp32 decode-attention kernel, every product holds its layout,
    the fused layers call it and compute the modules' bits, and greedy SSD equals autoregressive
    decoding token for token."""
    # heads of 32: the AMX attention kernel reads whole tiles of 32 dimensions
    heads = {"num_attention_heads": 2, "num_key_value_heads": 1}
    model = tiny_model(family, layers=LAYERS, hidden_size=64, intermediate_size=128, **heads)
    apply_attention(model, AttentionChoice("float32", attention))
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert use_bf16_weights(model, TILES) == len(weights)
    products = [m for m in model.modules() if isinstance(m, Bf16WeightLinear)]
    assert all(m.kernel == TILES for m in products)
    assert all(torch.equal(m.weight, w.bfloat16().float()) for m, w in zip(products, weights, strict=True))
    use_kernel_norms(model)
    use_kernel_rotary()
    use_kernel_silu(model)
    assert fuse_layers(model) == LAYERS and plan_kernels(model)["products"] == "amx-kernel"
    ids = torch.randint(0, model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    fused, modules = LayerwiseRunner(model), LayerwiseRunner(model)
    modules.fused = [None] * modules.num_layers
    logits = []
    for runner in (fused, modules):
        cache = runner.new_cache()
        runner.forward(ids[:, :16], cache=cache)
        logits.append(
            [runner.forward(ids[:, 16:17], cache=cache), runner.forward(ids[:, 17:21], cache=cache)]
        )
    assert all(torch.equal(a, b) for a, b in zip(*logits, strict=True))
    assert_greedy_ssd_lossless(model)
