"""`experiments/step_anatomy.py`'s split of a step without the profiler: the products' kernel calls
against the rest of the step, on a tiny model."""

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from skipsearch.models.bf16_weights import load_kernel, use_bf16_weights
from skipsearch.models.runner import LayerwiseRunner
from tests.conftest import tiny_model

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


@pytest.fixture
def anatomy(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the experiment imports its helpers as scripts do
    return importlib.import_module("step_anatomy")


@pytest.mark.skipif(
    load_kernel().function is None, reason=f"linear kernel unavailable: {load_kernel().reason}"
)
def test_a_step_splits_into_the_products_kernel_and_the_rest(anatomy: ModuleType) -> None:
    model = tiny_model("llama", layers=2, hidden_size=256, intermediate_size=1024)
    use_bf16_weights(model)
    split = anatomy.kernel_split(LayerwiseRunner(model), context=16, count=4)
    assert split is not None
    step, kernel, skipped = split
    assert 0 < kernel < step and 0 < skipped < step


def test_a_plan_without_the_products_kernel_has_no_split(anatomy: ModuleType) -> None:
    assert anatomy.kernel_split(LayerwiseRunner(tiny_model("llama", layers=2)), context=8, count=2) is None
