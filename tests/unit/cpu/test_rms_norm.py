"""The fallback plan's RMSNorms on the kernel (`cpu.rms_norm`): transformers' formula to float32
rounding, a row's norm independent of the rows beside it, transformers' own forward for what the
kernel does not take, and a model on it decoding losslessly with self-speculation."""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

from skipsearch.cpu import rms_norm
from skipsearch.cpu.bf16_weights import use_bf16_weights
from skipsearch.cpu.inventory import plan_kernels
from skipsearch.cpu.rms_norm import KernelRMSNorm, load_kernel, use_kernel_norms
from tests.conftest import assert_greedy_ssd_lossless, tiny_model

needs_kernel = pytest.mark.skipif(
    load_kernel().function is None, reason=f"norm kernel unavailable: {load_kernel().reason}"
)


def norm_of(kind: type, width: int, seed: int) -> torch.nn.Module:
    norm = kind(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=torch.Generator().manual_seed(seed)))
    return norm


@needs_kernel
@pytest.mark.parametrize("kind", [LlamaRMSNorm, Qwen2RMSNorm])
@pytest.mark.parametrize("shape", [(1, 1, 576), (1, 5, 64), (2, 3, 9, 8)])
def test_the_kernel_computes_transformers_formula(kind: type, shape: tuple[int, ...]) -> None:
    norm = norm_of(kind, shape[-1], seed=shape[-1])
    x = 3 * torch.randn(shape, generator=torch.Generator().manual_seed(1))
    expected = norm(x)
    got = KernelRMSNorm(norm)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-6)


@needs_kernel
def test_a_rows_norm_does_not_depend_on_the_rows_beside_it() -> None:
    """What makes a verify's norms equal the decode steps' bit for bit."""
    norm = KernelRMSNorm(norm_of(LlamaRMSNorm, 96, seed=0))
    x = torch.randn(1, 16, 96, generator=torch.Generator().manual_seed(2))
    alone = torch.cat([norm(x[:, r : r + 1]) for r in range(16)], dim=1)
    for rows in (2, 4, 16):
        assert torch.equal(norm(x[:, :rows]), alone[:, :rows]), rows


def test_what_the_kernel_does_not_take_runs_transformers_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 inputs, inputs not contiguous, widths not a multiple of 8, or no kernel: transformers'
    own forward, the same bits."""
    norm = norm_of(LlamaRMSNorm, 12, seed=3)
    kernel_norm = KernelRMSNorm(norm)
    odd = torch.randn(2, 12)
    assert torch.equal(kernel_norm(odd), norm(odd))
    wide = KernelRMSNorm(norm_of(LlamaRMSNorm, 16, seed=4))
    half = torch.randn(2, 16).bfloat16()
    assert torch.equal(wide(half), LlamaRMSNorm.forward(wide, half))
    strided = torch.randn(16, 3).T
    assert torch.equal(wide(strided), LlamaRMSNorm.forward(wide, strided))
    monkeypatch.setattr(rms_norm, "load_kernel", lambda: rms_norm.NativeLibrary(None, "stubbed"))
    x = torch.randn(4, 16)
    assert torch.equal(wide(x), LlamaRMSNorm.forward(wide, x))
    model = tiny_model("llama", layers=2)
    assert use_kernel_norms(model) == 0


@needs_kernel
def test_every_norm_of_the_model_is_replaced_and_keeps_its_weight() -> None:
    model = tiny_model("qwen2", layers=3)
    weights = [m.weight for m in model.modules() if isinstance(m, Qwen2RMSNorm)]
    assert use_kernel_norms(model) == 2 * 3 + 1
    kernel_norms = [m for m in model.modules() if isinstance(m, KernelRMSNorm)]
    assert [m.weight for m in kernel_norms] == weights
    assert not any(isinstance(m, Qwen2RMSNorm) for m in model.modules())


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_self_speculation_on_kernel_norms_is_lossless(family: str) -> None:
    """Greedy SSD equals autoregressive decoding token for token on the whole fallback plan."""
    model = tiny_model(family, layers=4, hidden_size=64, num_attention_heads=4)
    use_bf16_weights(model)
    assert use_kernel_norms(model) == 2 * 4 + 1
    assert_greedy_ssd_lossless(model)


@needs_kernel
def test_the_plan_names_the_norm_kernel() -> None:
    model = tiny_model("llama", layers=1)
    assert plan_kernels(model)["norms"] == "torch"
    use_kernel_norms(model)
    assert plan_kernels(model)["norms"] == "kernel"
