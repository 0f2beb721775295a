"""The fused decoder layers (`cpu.fused_layers`): the modules' bits exactly, in every pass the
engine makes (decode steps, verifies, KV-pattern drafts, pillar choices), and lossless decoding."""

import ctypes

import pytest
import torch

from skipsearch.cpu import bf16_weights, decode_attention, fused_driver, rms_norm, rotary, silu
from skipsearch.cpu.attention_choice import AttentionChoice
from skipsearch.cpu.attention_paths import KERNEL_FP32_ATTENTION
from skipsearch.cpu.bf16_weights import use_bf16_weights
from skipsearch.cpu.fused_driver import FusedLayer
from skipsearch.cpu.fused_layers import fuse_layers, fused_layer
from skipsearch.cpu.inventory import plan_kernels
from skipsearch.cpu.rms_norm import use_kernel_norms
from skipsearch.cpu.rotary import use_kernel_rotary
from skipsearch.cpu.silu import use_kernel_silu
from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.kv.pillars import PillarChoice, PillarKeys
from skipsearch.masks import KVPattern, SkipMask
from skipsearch.models.kernels import apply_attention, new_cache
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import assert_greedy_ssd_lossless, tiny_model

KERNELS = (bf16_weights.load_kernel(), rms_norm.load_kernel(), rotary.load_kernel(),
           decode_attention.load_kernel(torch.float32), silu.load_kernel(),
           fused_driver.load_driver())  # fmt: skip
needs_kernels = pytest.mark.skipif(
    any(kernel.function is None for kernel in KERNELS),
    reason="; ".join(kernel.reason for kernel in KERNELS if kernel.function is None),
)
LAYERS = 4


def on_the_plan(family: str, **overrides: int) -> torch.nn.Module:
    """A tiny model (head width 16, which the rotary kernel reads) on the fp32 fallback plan."""
    model = tiny_model(family, layers=LAYERS, hidden_size=64, intermediate_size=128, **overrides)
    apply_attention(model, AttentionChoice("float32", KERNEL_FP32_ATTENTION))
    use_bf16_weights(model)
    use_kernel_norms(model)
    use_kernel_rotary()
    use_kernel_silu(model)
    return model


def both_paths(model: torch.nn.Module) -> tuple[LayerwiseRunner, LayerwiseRunner]:
    """(fused, modules): two runners of one model, the second never taking the fused path."""
    fused, modules = LayerwiseRunner(model), LayerwiseRunner(model)
    modules.fused = [None] * modules.num_layers
    return fused, modules


@needs_kernels
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_fused_layers_compute_the_modules_bits(family: str) -> None:
    """Steps, a verify block, and draft steps over a sink + window pattern and over pillars: the same
    logits and the same cache, bit for bit."""
    model = on_the_plan(family)
    assert fuse_layers(model) == LAYERS
    ids = torch.randint(0, model.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    pattern = KVPattern(sink=2, window=8, pillars=3)
    outputs = []
    for runner in both_paths(model):
        cache = runner.new_cache()
        logits = [runner.forward(ids[:, :30], cache=cache)]  # a prefill: the modules on both
        for start, rows in ((30, 1), (31, 4), (35, 1)):
            logits.append(runner.forward(ids[:, start : start + rows], cache=cache))
        positions = torch.arange(36, 38)[None]
        hidden = runner.run_layers(runner.embed(ids[:, 36:38]), 0, LAYERS, positions, cache=cache, kv=pattern)
        logits.append(runner.head(hidden))
        chosen = [
            torch.tensor([[0, 5, 20]] * 2),
            None,
            torch.tensor([[1, 2, 3]] * 2),
            torch.tensor([[9, 4, 7]] * 2),
        ]
        reads = PillarKeys.gather(pattern, chosen, cache)
        hidden = runner.run_layers(
            runner.embed(ids[:, 38:39]), 0, LAYERS, positions[:, :1] + 2, cache=cache, kv=reads
        )
        logits.append(runner.head(hidden))
        outputs.append((logits, [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]))
    (fused_logits, fused_cache), (module_logits, module_cache) = outputs
    assert all(torch.equal(f, m) for f, m in zip(fused_logits, module_logits, strict=True))
    assert all(
        torch.equal(f, m)
        for pair in zip(fused_cache, module_cache, strict=True)
        for f, m in zip(*pair, strict=True)
    )


@needs_kernels
def test_a_verify_records_the_modules_pillar_scores() -> None:
    model = on_the_plan("llama")
    fuse_layers(model)
    ids = torch.randint(0, model.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(1))
    pattern = KVPattern(sink=1, window=4, pillars=5)
    chosen = []
    for runner in both_paths(model):
        cache = runner.new_cache()
        runner.forward(ids[:, :36], cache=cache)
        choice = PillarChoice(pattern, torch.tensor([[36]]), LAYERS, model.config.num_key_value_heads)
        runner.run_layers(runner.embed(ids[:, 36:37]), 0, LAYERS, torch.tensor([[36]]), cache=cache,
                          kv=pattern, pillars=choice)  # fmt: skip
        chosen.append(choice.first_rows())
    assert all(torch.equal(f, m) for f, m in zip(*chosen, strict=True))


@needs_kernels
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_self_speculation_on_fused_layers_is_lossless(family: str) -> None:
    model = on_the_plan(family)
    fuse_layers(model)
    assert_greedy_ssd_lossless(model)
    runner = LayerwiseRunner(model)
    prompt = list(range(3, 60))
    expected = autoregressive_decode(runner, prompt, 24).tokens
    mask = SkipMask.from_layers(LAYERS, [])
    drafted = speculative_decode(runner, prompt, mask, 24, gamma=3, kv=KVPattern(sink=2, window=8, pillars=4))
    assert drafted.tokens == expected


@needs_kernels
def test_fusing_shares_the_projections_weights_and_is_recorded() -> None:
    model = on_the_plan("qwen2")
    attention = model.model.layers[0].self_attn
    weights = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
    assert plan_kernels(model)["layers"] == "modules"
    assert fuse_layers(model) == LAYERS and fuse_layers(model) == 0  # once per layer
    fused = fused_layer(model.model.layers[0])
    assert fused is not None and plan_kernels(model)["layers"] == "fused-c"
    assert attention.q_proj.packed.data_ptr() == fused.qkv.data_ptr()  # a view, not a copy
    assert attention.v_proj.packed.untyped_storage().data_ptr() == fused.qkv.untyped_storage().data_ptr()
    assert all(
        torch.equal(w, p.weight)
        for w, p in zip(weights, (attention.q_proj, attention.k_proj, attention.v_proj), strict=True)
    )
    q_width = fused.spec.heads * fused.spec.dim
    assert fused.qkv_bias is not None and torch.equal(fused.qkv_bias[:q_width], attention.q_proj.bias)


@needs_kernels
def test_layers_the_fused_path_would_not_compute_alike_keep_their_modules() -> None:
    windowed = on_the_plan("mistral", sliding_window=16)
    assert not FusedLayer.fits(windowed.model.layers[0])
    narrow = on_the_plan("llama", num_attention_heads=8)  # head width 8: the rotary kernel's minimum is 16
    assert fuse_layers(narrow) == 0
    unplanned = tiny_model("llama", layers=2, hidden_size=64)
    assert fuse_layers(unplanned) == 0 and plan_kernels(unplanned)["layers"] == "modules"


@needs_kernels
def test_the_sub_layer_calls_the_profiler_times_run_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`skipsearch profile` times `runner.attention` and `runner.mlp` one by one: a profile of the
    fused plan must time the fused path, not the modules."""
    model = on_the_plan("llama")
    fuse_layers(model)
    runner = LayerwiseRunner(model)
    calls = []
    for name in ("attention", "mlp"):
        monkeypatch.setattr(FusedLayer, name, lambda self, *args, name=name, **kwargs: calls.append(name))
    cache = runner.new_cache()
    runner.forward(torch.arange(3, 20)[None], cache=cache)
    hidden = runner.embed(torch.tensor([[5]]))
    positions = torch.tensor([[17]])
    mask = runner.causal_mask(hidden, positions, cache, 0)
    runner.attention(0, hidden, runner.rotary(hidden, positions), mask, cache)
    runner.mlp(0, hidden)
    assert calls == ["attention", "mlp"]


@needs_kernels
def test_the_driver_times_its_products_only_where_asked() -> None:
    """`experiments/step_anatomy.py` splits a step into the products and the rest this way."""
    model = on_the_plan("llama")
    fuse_layers(model)
    runner = LayerwiseRunner(model)
    layers = [fused_layer(block) for block in model.model.layers]
    seconds = ctypes.c_double(0.0)
    for layer in layers:
        layer.time_products(seconds)
    cache = runner.new_cache()
    runner.forward(torch.arange(3, 30)[None], cache=cache)  # a prefill: the modules, not the driver
    assert seconds.value == 0.0
    runner.forward(torch.tensor([[7]]), cache=cache)
    timed = seconds.value
    assert timed > 0.0
    for layer in layers:
        layer.time_products(None)
    runner.forward(torch.tensor([[8]]), cache=cache)
    assert seconds.value == timed


@needs_kernels
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_transformers_generate_decodes_on_the_fused_layers(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole-model forward (HF `generate`) takes the fused path for its decode steps, and its
    logits are the modules' bits."""
    model = on_the_plan(family)
    fuse_layers(model)
    calls = []
    fused_mlp = FusedLayer.mlp

    def counted(layer: FusedLayer, hidden: torch.Tensor) -> torch.Tensor:
        calls.append(layer)
        return fused_mlp(layer, hidden)

    monkeypatch.setattr(FusedLayer, "mlp", counted)
    ids = torch.randint(3, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(2))

    def generated() -> tuple[torch.Tensor, ...]:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), cache=new_cache(model.config),
                             max_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)  # fmt: skip
        return out.logits

    fused = generated()
    assert len(calls) == 5 * LAYERS  # every decode step after the prefill, every layer
    for block in model.model.layers:
        del block.forward  # the modules' forward again
    calls.clear()
    modules = generated()
    assert not calls
    assert all(torch.equal(f, m) for f, m in zip(fused, modules, strict=True))
