"""Stacked projections (`models.stacked`): the same outputs from fewer matrix products."""

from __future__ import annotations

import pytest
import torch

from skipsearch.engine import autoregressive_decode, speculative_decode
from skipsearch.masks import SkipMask
from skipsearch.models.kernels import step_bytes
from skipsearch.models.runner import LayerwiseRunner
from skipsearch.models.stacked import SliceOfStack, StackedLinear, stack_projections
from tests.conftest import tiny_model


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2's q/k/v carry biases
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stacked_model_computes_what_the_separate_projections_did(family: str, dtype: torch.dtype) -> None:
    model = tiny_model(family).to(dtype)
    ids = torch.randint(3, 61, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
        weights_before = step_bytes(model)
        weights = [model.model.layers[0].self_attn.k_proj.weight.clone()]
        groups = stack_projections(model)
        after = model(ids).logits
    assert groups == 2 * model.config.num_hidden_layers
    attention = model.model.layers[0].self_attn
    assert isinstance(attention.qkv_proj, StackedLinear) and isinstance(attention.v_proj, SliceOfStack)
    torch.testing.assert_close(attention.k_proj.weight, weights[0])  # still readable as a projection's
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5 if dtype == torch.float32 else 0.05)
    assert step_bytes(model) == weights_before  # the stack replaces the weights, it does not copy them
    assert stack_projections(model) == 0  # already stacked: left alone


def test_the_stash_is_released_once_every_slice_is_taken() -> None:
    model = tiny_model()
    stack_projections(model)
    stack = model.model.layers[0].mlp.gate_up_proj
    with torch.no_grad():
        model(torch.tensor([[5, 6, 7]]))
    assert stack._input is None and stack._slices == ()


def test_greedy_ssd_stays_lossless_on_a_stacked_model() -> None:
    model = tiny_model(layers=6)
    stack_projections(model)
    runner = LayerwiseRunner(model)
    prompt = (5, 9, 14, 3, 22, 40)
    ar = autoregressive_decode(runner, prompt, 20)
    ssd = speculative_decode(runner, prompt, SkipMask.from_layers(6, [2, 4]), 20, gamma=3)
    assert ssd.tokens == ar.tokens


def test_a_stacked_model_moves_as_one() -> None:
    model = tiny_model()
    stack_projections(model)
    model.to("meta")
    attention = model.model.layers[0].self_attn
    assert attention.qkv_proj.weight.is_meta and attention.q_proj.weight.is_meta
    assert attention.k_proj._stack[0] is attention.qkv_proj
