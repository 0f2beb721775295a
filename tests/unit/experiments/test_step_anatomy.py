"""`experiments/step_anatomy.py`'s split of a step without the profiler: the products' kernel calls
against the rest of the step, on a tiny model."""

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from skipsearch.cpu.bf16_weights import load_kernel, use_bf16_weights
from skipsearch.cpu.fused_layers import fuse_layers
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model
from tests.unit.cpu.test_fused_layers import on_the_plan

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


@pytest.fixture
def anatomy(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the experiment imports its helpers as scripts do
    return importlib.import_module("step_anatomy")


@pytest.mark.skipif(
    load_kernel().function is None, reason=f"linear kernel unavailable: {load_kernel().reason}"
)
@pytest.mark.parametrize("fused", [False, True])
def test_a_step_splits_into_the_products_kernel_and_the_rest(anatomy: ModuleType, fused: bool) -> None:
    """On the modules' products and on the fused layers' C driver, which times its own calls and
    stops timing after the split."""
    model = tiny_model("llama", layers=2, hidden_size=256, intermediate_size=1024)
    if fused:
        model = on_the_plan("llama")
        assert fuse_layers(model) > 0
    else:
        use_bf16_weights(model)
    runner = LayerwiseRunner(model)
    split = anatomy.kernel_split(runner, context=16, count=4)
    assert split is not None
    step, kernel = split
    assert 0 < kernel < step
    assert all(not layer.spec.product_seconds for layer in runner.fused if layer is not None)


def test_a_plan_without_the_products_kernel_has_no_split(anatomy: ModuleType) -> None:
    assert anatomy.kernel_split(LayerwiseRunner(tiny_model("llama", layers=2)), context=8, count=2) is None


@pytest.mark.skipif(
    load_kernel().function is None, reason=f"linear kernel unavailable: {load_kernel().reason}"
)
def test_a_verify_splits_by_positions_against_the_step(anatomy: ModuleType) -> None:
    """Every position count gets a pass and its products; the table sets each against the step
    (f = 1 and nothing added at one position) and has one row per count."""
    runner = LayerwiseRunner(on_the_plan("llama"))
    assert fuse_layers(runner.model) > 0
    split = anatomy.verify_split(runner, context=16, count=2, positions=[1, 3], repeats=2)
    assert sorted(split) == [1, 3]
    assert all(0 < kernel < ms for ms, kernel in split.values())
    rows = anatomy.verify_table(16, split)
    assert len(rows) == 2 and rows[0].startswith("| 16 | 1 |") and rows[1].startswith("| 16 | 3 |")
    assert "| 1.000 |" in rows[0] and "(+0.00)" in rows[0]
    assert anatomy.verify_table(16, {}) == []
