"""The fallback plan's rotary embedding on the kernel (`cpu.rotary`): transformers' bits exactly,
transformers' own function for what the kernel does not take, and installed once per family."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers.models.llama import modeling_llama

from skipsearch.cpu import rotary
from skipsearch.cpu.rotary import FAMILIES, ROTARY_FUNCTION, kernel_rotary, load_kernel, use_kernel_rotary
from tests.conftest import tiny_model

needs_kernel = pytest.mark.skipif(
    load_kernel().function is None, reason=f"rotary kernel unavailable: {load_kernel().reason}"
)
REFERENCE = getattr(modeling_llama.apply_rotary_pos_emb, "reference", modeling_llama.apply_rotary_pos_emb)


def block(heads: int, kv_heads: int, rows: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    """Queries and keys as the attention module makes them (views of `[1, rows, heads * dim]`
    projections), and the cos and sin of `rows` positions."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, rows, heads * dim, generator=generator).view(1, rows, heads, dim).transpose(1, 2)
    k = torch.randn(1, rows, kv_heads * dim, generator=generator).view(1, rows, kv_heads, dim).transpose(1, 2)
    angles = 300 * torch.rand(1, rows, dim // 2, generator=generator)
    both = torch.cat((angles, angles), dim=-1)
    return q, k, both.cos(), both.sin()


@needs_kernel
@pytest.mark.parametrize(
    ("heads", "kv_heads", "rows", "dim"), [(9, 3, 1, 64), (14, 2, 4, 64), (4, 4, 17, 32)]
)
def test_the_kernel_gives_transformers_bits(heads: int, kv_heads: int, rows: int, dim: int) -> None:
    q, k, cos, sin = block(heads, kv_heads, rows, dim, seed=rows)
    expected = REFERENCE(q, k, cos, sin)
    got = kernel_rotary(REFERENCE)(q, k, cos, sin)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and torch.equal(a, b)


def test_what_the_kernel_does_not_take_runs_transformers_function(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def reference(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(args)
        return REFERENCE(*args)

    apply = kernel_rotary(reference)
    q, k, cos, sin = block(4, 2, 3, 32, seed=0)
    apply(q.bfloat16(), k.bfloat16(), cos.bfloat16(), sin.bfloat16())  # not float32
    apply(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), cos.expand(2, -1, -1), sin.expand(2, -1, -1))
    narrow = block(4, 2, 3, 8, seed=1)  # a head 8 floats wide
    apply(*narrow)
    monkeypatch.setattr(rotary, "load_kernel", lambda: rotary.NativeLibrary(None, "stubbed"))
    apply(q, k, cos, sin)
    assert len(calls) == 4


@needs_kernel
def test_installing_wraps_each_familys_function_once() -> None:
    assert use_kernel_rotary() and use_kernel_rotary()
    for name in FAMILIES:
        installed = getattr(importlib.import_module(name), ROTARY_FUNCTION)
        assert installed.reference is not None and not hasattr(installed.reference, "reference")


@needs_kernel
def test_a_model_runs_the_kernel_rotary_once_its_family_has_it() -> None:
    use_kernel_rotary()
    assert rotary.runs_kernel_rotary(tiny_model("qwen2", layers=1))
