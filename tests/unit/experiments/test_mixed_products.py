"""`experiments/mixed_products.py`: the exactness check that weighs a verify on other products than
the steps', and its f(γ) cells, on a tiny model."""

import importlib
from pathlib import Path
from types import ModuleType

import pytest

from skipsearch.cpu.bf16_weights import VECTOR, load_kernel
from skipsearch.cpu.fused_layers import fuse_layers
from skipsearch.models.runner import LayerwiseRunner
from tests.unit.cpu.test_fused_layers import on_the_plan

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


@pytest.fixture
def mixed(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the experiment imports its helpers as scripts do
    return importlib.import_module("mixed_products")


@pytest.mark.skipif(load_kernel().function is None, reason=f"no vector kernel: {load_kernel().reason}")
def test_one_kernel_for_steps_and_passes_measures_no_gap(mixed: ModuleType) -> None:
    """With the steps and the 5-position passes on the same kernel (today's plan) the check finds
    the same bits (gap 0), and it records one top-two margin per decoded position."""
    model = on_the_plan("llama")
    assert fuse_layers(model) > 0
    runner = LayerwiseRunner(model)
    prompts = [tuple(range(3, 15)), tuple(range(20, 29))]
    checked = mixed.exactness({VECTOR: runner, mixed.TILES: runner}, prompts, new_tokens=7)
    assert checked["gap"] == 0.0
    assert len(checked["margins"]) == 14 and all(m >= 0 for m in checked["margins"])


def test_f_divides_each_rounds_pass_by_that_rounds_step(mixed: ModuleType) -> None:
    passes = {("b", p): [10.0 + p, 12.0 + p, 11.0 + p] for p in range(1, 6)}
    samples = {("a", 1): [10.0, 12.0, 11.0], **passes}
    cells = mixed.f_cells(samples, "a", "b")
    assert len(cells) == 4
    assert cells[0].startswith("1.182 (1.17–1.20)")  # 12/10, 14/12, 13/11: median 13/11
