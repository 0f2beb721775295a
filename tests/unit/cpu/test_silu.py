"""The fallback plan's SiLU on the kernel (`cpu.silu`): within a few ulp of the exact SiLU, a
value's SiLU the same bits wherever it sits, torch's SiLU for what the kernel does not take, and
every SiLU of a model replaced."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.activations import SiLUActivation

from skipsearch.cpu import silu
from skipsearch.cpu.silu import KernelSiLU, load_kernel, use_kernel_silu
from tests.conftest import tiny_model

needs_kernel = pytest.mark.skipif(
    load_kernel().function is None, reason=f"SiLU kernel unavailable: {load_kernel().reason}"
)


def ulps(got: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """|got - exact| in units of float32's last place at `exact` (float64)."""
    return (got.double() - exact).abs() / (exact.abs() * 2.0**-23).clamp_min(2.0**-149)


@needs_kernel
def test_the_kernel_is_within_two_ulp_of_the_exact_silu() -> None:
    """As close as torch's own (which measures 1.3 ulp at worst on these values)."""
    x = torch.cat(
        [
            5 * torch.randn(200_000, generator=torch.Generator().manual_seed(0)),
            torch.linspace(-80, 80, 20_001),
        ]
    )
    got = KernelSiLU()(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert ulps(got, F.silu(x.double())).max() < 2.0
    assert torch.equal(KernelSiLU()(torch.tensor([0.0, -0.0, 100.0])), torch.tensor([0.0, 0.0, 100.0]))


@needs_kernel
def test_a_values_silu_does_not_depend_on_where_it_sits() -> None:
    """The tail of a row (past a multiple of 8) and a strided row give the vector path's bits: what
    lets the C driver's MLP equal the modules' (`cpu.fused_layers`)."""
    x = torch.randn(3, 21, generator=torch.Generator().manual_seed(1))
    whole = KernelSiLU()(x)
    one_by_one = torch.stack([KernelSiLU()(x[r, c : c + 1]) for r in range(3) for c in range(21)]).view(3, 21)
    assert torch.equal(whole, one_by_one)
    gate_up = torch.randn(2, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(KernelSiLU()(gate_up[:, :16]), KernelSiLU()(gate_up[:, :16].contiguous()))


def test_what_the_kernel_does_not_take_runs_torchs_silu(monkeypatch: pytest.MonkeyPatch) -> None:
    half = torch.randn(4, 16).bfloat16()
    assert torch.equal(KernelSiLU()(half), F.silu(half))
    monkeypatch.setattr(silu, "load_kernel", lambda: silu.NativeLibrary(None, "stubbed"))
    x = torch.randn(4, 16)
    assert torch.equal(KernelSiLU()(x), F.silu(x))
    assert use_kernel_silu(tiny_model("llama", layers=2)) == 0


@needs_kernel
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_every_silu_of_the_model_is_replaced(family: str) -> None:
    model = tiny_model(family, layers=3)
    assert use_kernel_silu(model) == 3
    assert not any(isinstance(m, SiLUActivation | torch.nn.SiLU) for m in model.modules())
    assert sum(isinstance(m, KernelSiLU) for m in model.modules()) == 3
