"""The fp32 fallback plan's products: MKL, oneDNN's packed weights or the bf16-weight kernel,
whichever measures fastest, measured once per machine, and only under `--dtype auto`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipsearch.cpu import fp32_linear
from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.bf16_weights import load_kernel as load_linear_kernel
from skipsearch.cpu.fp32_linear import BF16_KERNEL, MKL, ONEDNN, Fp32Linear, choose_fp32_linear
from skipsearch.cpu.packed import PackedLinear
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.loading import load_model
from skipsearch.models.random_weights import RandomWeights
from skipsearch.models.runner import LayerwiseRunner

needs_kernel = pytest.mark.skipif(
    load_linear_kernel().function is None, reason=f"linear kernel unavailable: {load_linear_kernel().reason}"
)


def timings(mkl: float, onednn: float, kernel: float) -> dict[str, dict[str, float]]:
    by_library = {MKL: mkl, ONEDNN: onednn, BF16_KERNEL: kernel}
    return {library: {"1": ms, "4": 2 * ms} for library, ms in by_library.items()}


@pytest.mark.parametrize(
    ("measured", "library", "kept"),
    [
        (timings(2.0, 1.0, 3.0), ONEDNN, True),
        (timings(1.0, 2.0, 3.0), MKL, True),
        (timings(2.0, 1.5, 0.5), BF16_KERNEL, True),
        (timings(1.0, 0.95, 3.0), ONEDNN, False),
    ],
    ids=["oneDNN fastest", "MKL fastest", "kernel fastest", "alike"],
)
def test_the_fastest_product_is_chosen_and_kept_only_when_decisive(
    cache_in_tmp: Path,
    idle_cpu: None,
    monkeypatch: pytest.MonkeyPatch,
    measured: dict,
    library: str,
    kept: bool,
) -> None:
    monkeypatch.setattr(fp32_linear, "measure_fp32_products", lambda: measured)
    choice = choose_fp32_linear()
    assert choice.library == library and choice.timings == measured
    path = fp32_linear.choice_path(fp32_linear.CHOICE_NAME)
    assert path.is_file() is kept
    if kept:
        monkeypatch.setattr(fp32_linear, "measure_fp32_products", lambda: pytest.fail("measured again"))
        assert choose_fp32_linear() == choice
        assert json.loads(path.read_text())["library"] == library
    assert fp32_linear.LIBRARY_NAMES[library] in choice.describe()


def test_a_choice_made_with_another_kernel_build_is_measured_again(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fp32_linear, "measure_fp32_products", lambda: timings(2.0, 1.0, 0.5))
    first = choose_fp32_linear()
    path = fp32_linear.choice_path(fp32_linear.CHOICE_NAME)
    path.write_text(json.dumps({**json.loads(path.read_text()), "kernel_build": "an older one"}))
    monkeypatch.setattr(fp32_linear, "measure_fp32_products", lambda: timings(1.0, 2.0, 3.0))
    expected = MKL if load_linear_kernel().function is not None else first.library
    assert choose_fp32_linear().library == expected


def test_the_measurement_times_every_product_at_each_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp32_linear, "PROBE_REPEATS", 1)
    measured = fp32_linear.measure_fp32_products()
    expected = {MKL, ONEDNN} | ({BF16_KERNEL} if load_linear_kernel().function is not None else set())
    assert set(measured) == expected
    assert all(set(by_rows) == {"1", "4"} and min(by_rows.values()) > 0 for by_rows in measured.values())


@pytest.mark.parametrize(
    ("dtype", "library", "kind"),
    [
        ("auto", ONEDNN, PackedLinear),
        pytest.param("auto", BF16_KERNEL, Bf16WeightLinear, marks=needs_kernel),
        ("float32", ONEDNN, None),
    ],
)
def test_only_the_auto_fallback_runs_the_chosen_product(
    monkeypatch: pytest.MonkeyPatch, dtype: str, library: str, kind: type | None
) -> None:
    """On a CPU without native bf16 (flags stubbed), `--dtype auto` runs the product measured
    fastest, draft heads included; `--dtype float32` keeps MKL's exact products unmeasured."""
    monkeypatch.setattr("skipsearch.cpu.dtypes.cpu_flags", lambda: frozenset({"avx2", "fma"}))
    chosen = Fp32Linear(library, timings(2.0, 1.0, 0.5))
    monkeypatch.setattr(
        fp32_linear, "choose_fp32_linear", lambda: chosen if dtype == "auto" else pytest.fail()
    )
    loaded = load_model("smollm2-135m", "cpu", dtype, RandomWeights(num_layers=1))
    up = loaded.model.model.layers[0].mlp.up_proj
    head = DraftHead.gather(LayerwiseRunner(loaded.model), [3, 1, 4])
    assert loaded.plan.details.startswith("float32")
    if kind is None:
        assert not isinstance(up, PackedLinear | Bf16WeightLinear) and "MKL" not in loaded.plan.details
    else:
        assert isinstance(up, kind) and isinstance(head.product, kind)
        assert fp32_linear.LIBRARY_NAMES[library] in loaded.plan.details
