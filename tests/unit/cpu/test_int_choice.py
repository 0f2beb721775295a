"""Which kernel runs a lower-precision draft's products (`cpu.int_choice`): the rule, the probe at
the model's shapes, the cache, and the fallbacks where a kernel is missing."""

from pathlib import Path

import pytest

from skipsearch.cpu import int_choice, int_linear
from skipsearch.cpu.int_choice import (
    OURS,
    PROBE_ROWS,
    TORCH,
    IntProductsChoice,
    choose_int_products,
    decide,
    draft_group,
    draft_shapes,
    probed_layers,
)
from tests.conftest import tiny_model


def timings(ours: tuple[float, float], theirs: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {
        "int8 ours": dict(zip(map(str, PROBE_ROWS), ours, strict=True)),
        "int8 torch": dict(zip(map(str, PROBE_ROWS), theirs, strict=True)),
    }


@pytest.mark.parametrize(
    ("ours", "theirs", "expected"),
    [
        ((0.70, 1.20), (0.90, 1.40), OURS),
        ((0.70, 1.20), (0.60, 1.00), TORCH),  # faster at both row counts
        ((0.70, 1.20), (0.60, 1.30), OURS),  # slower where a tree's depth runs
        ((0.70, 1.20), (0.69, 1.19), OURS),  # within the tie
    ],
)
def test_torch_runs_only_where_faster_at_every_row_count(
    ours: tuple[float, float], theirs: tuple[float, float], expected: str
) -> None:
    assert decide(timings(ours, theirs), 8) == expected


def test_the_probe_reads_the_fused_layers_shapes() -> None:
    model = tiny_model("qwen2", layers=3, hidden_size=64, intermediate_size=128)
    shapes, layers = draft_shapes(model)
    heads, kv_heads = model.config.num_attention_heads, model.config.num_key_value_heads
    head_dim = 64 // heads
    assert shapes == [((heads + 2 * kv_heads) * head_dim, 64), (64, heads * head_dim), (256, 64), (64, 128)]
    assert layers == 3 and draft_group(shapes) == 32
    assert probed_layers(shapes, 3) == 3  # a small model: all its layers
    assert probed_layers([(4096, 4096)] * 4, 40) == 1  # at least one


@pytest.mark.skipif(
    not (int_linear.builds(int_linear.INT8) and int_linear.builds(int_linear.INT4)), reason="no int kernels"
)
def test_measured_once_and_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Kept on disk, or where the machine is busy for this process only: measured once either way."""
    monkeypatch.setattr(int_choice, "choice_path", lambda name: tmp_path / f"{name}.json")
    monkeypatch.setattr(int_choice, "_UNKEPT", {})
    monkeypatch.setattr(int_choice, "PROBE_REPEATS", 1)
    model = tiny_model("llama", layers=2, hidden_size=64, intermediate_size=128)
    choice = choose_int_products(model)
    assert set(choice.kernels) == {"int8", "int4"} and set(choice.kernels.values()) <= {OURS, TORCH}
    assert set(choice.timings) == {"int8 ours", "int8 torch", "int4 ours", "int4 torch"}
    assert all(set(by_rows) == set(map(str, PROBE_ROWS)) for by_rows in choice.timings.values())
    assert choice.torch_dtype == str(int_choice.torch_dtype()).removeprefix("torch.")
    assert "lower-precision products: int8 on" in choice.describe()
    monkeypatch.setattr(int_choice, "measure", lambda *args: pytest.fail("measured again"))
    assert choose_int_products(model) == choice


@pytest.mark.skipif(
    not (int_linear.builds(int_linear.INT8) and int_linear.builds(int_linear.INT4)), reason="no int kernels"
)
def test_without_torchs_kernels_ours_run_unmeasured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        int_choice.int_torch, "available", lambda: "torch 0.0 has no aten._weight_int8pack_mm"
    )
    monkeypatch.setattr(int_choice, "measure", lambda *args: pytest.fail("nothing to compare"))
    choice = choose_int_products(tiny_model("llama", layers=1, hidden_size=64, intermediate_size=128))
    assert choice.kernels == {"int8": OURS, "int4": OURS} and "no aten" in choice.unavailable
    assert choice.kernel(8) == OURS and not choice.timings


def test_without_ours_torchs_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(int_choice.int_linear, "builds", lambda kind: {})
    choice = choose_int_products(tiny_model("llama", layers=1, hidden_size=64, intermediate_size=128))
    assert choice == IntProductsChoice(
        {"int8": TORCH, "int4": TORCH}, unavailable="our int kernels do not load or take these shapes"
    )
