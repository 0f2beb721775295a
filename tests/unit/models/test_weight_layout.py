"""The plan's weight dtypes from the first byte: random weights built module by module in them, a
model that does not fit refused before any weight is made, and a GGUF cache of bf16 matrices."""

import pytest
import torch
from torch import nn

from skipsearch.errors import ModelLoadError
from skipsearch.models import memory_fit
from skipsearch.models.loading import load_model
from skipsearch.models.memory_fit import check_fits, model_bytes
from skipsearch.models.random_weights import RandomWeights, random_config, random_model
from skipsearch.models.weight_layout import WeightDtypes

MIXED = WeightDtypes("float32", "bfloat16")


def test_random_weights_are_made_in_the_plans_dtypes() -> None:
    """The matrices in bf16 (the exact rounding of the float32 build's), the embedding, norms and
    tied head in float32."""
    weights = RandomWeights(num_layers=1, seed=3)
    wide = random_model("smollm2-135m", "cpu", torch.float32, weights)
    mixed = random_model("smollm2-135m", "cpu", torch.float32, weights, torch.bfloat16)
    layer = mixed.model.layers[0]
    assert layer.mlp.up_proj.weight.dtype == layer.self_attn.q_proj.weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == mixed.model.embed_tokens.weight.dtype == torch.float32
    assert mixed.lm_head.weight is mixed.model.embed_tokens.weight
    for name, tensor in mixed.state_dict().items():
        assert torch.equal(wide.state_dict()[name].to(tensor.dtype), tensor), name


def test_the_fallback_plan_packs_the_bf16_matrices_it_was_built_with() -> None:
    loaded = load_model("smollm2-135m", "cpu", "auto", RandomWeights(num_layers=1))
    plain = [m for m in loaded.model.modules() if type(m) is nn.Linear]
    if "bf16 weights, fp32 activations" in loaded.plan.line:
        assert plain == []  # every matrix went to the kernel, none left in bf16 beside fp32 activations
    assert all(m.weight.dtype == loaded.model.model.embed_tokens.weight.dtype for m in plain)


def test_the_bytes_are_counted_in_the_layouts_dtypes() -> None:
    config = random_config("mistral-7b", RandomWeights(num_layers=2))
    wide, mixed = model_bytes(config, WeightDtypes("float32", "float32")), model_bytes(config, MIXED)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert mixed.layer == 2 * layer + 4 * 2 * 4096 and wide.layer == wide.wide_layer == 4 * (layer + 2 * 4096)
    assert mixed.outside == 4 * 32768 * 4096 + 2 * 32768 * 4096 + 4 * 4096  # fp32 embedding, bf16 head


def test_a_model_that_does_not_fit_is_refused_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: int(6e9))
    made = []
    monkeypatch.setattr("skipsearch.models.loading.random_model", lambda *a: made.append(a))
    refusal = (
        r"mistral-7b needs about \d+\.\d GB .* 6\.0 GB available: use --dtype bfloat16 or --num-layers 3"
    )
    with pytest.raises(ModelLoadError, match=refusal):
        load_model("mistral-7b", "cpu", "float32", RandomWeights(num_layers=8))
    assert made == []
    config = random_config("mistral-7b", RandomWeights(num_layers=4))
    assert check_fits(config, MIXED, "mistral-7b", True).layers == 4  # its plan's bf16 matrices fit
    monkeypatch.setattr(memory_fit, "available_bytes", lambda: int(1e9))
    with pytest.raises(ModelLoadError, match="a machine with more memory"):
        check_fits(config, MIXED, "mistral-7b", False)
