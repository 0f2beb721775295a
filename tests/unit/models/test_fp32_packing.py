"""The fp32 fallback plan's products: oneDNN's packed weights where they measure faster than MKL,
measured once per machine, and only under `--dtype auto`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skipsearch.models import fp32_packing
from skipsearch.models.draft_head import DraftHead
from skipsearch.models.fp32_packing import Fp32Packing, choose_fp32_packing
from skipsearch.models.loading import load_model
from skipsearch.models.packed import PackedLinear
from skipsearch.models.random_weights import RandomWeights
from skipsearch.models.runner import LayerwiseRunner


def timings(mkl: float, onednn: float) -> dict[str, dict[str, float]]:
    return {"mkl": {"1": mkl, "4": 2 * mkl}, "onednn": {"1": onednn, "4": 2 * onednn}}


@pytest.mark.parametrize(
    ("measured", "packs", "kept"),
    [(timings(2.0, 1.0), True, True), (timings(1.0, 2.0), False, True), (timings(1.0, 0.95), False, False)],
    ids=["oneDNN faster", "MKL faster", "alike"],
)
def test_the_faster_library_is_chosen_and_kept_only_when_decisive(
    cache_in_tmp: Path,
    idle_cpu: None,
    monkeypatch: pytest.MonkeyPatch,
    measured: dict,
    packs: bool,
    kept: bool,
) -> None:
    monkeypatch.setattr(fp32_packing, "measure_fp32_products", lambda: measured)
    choice = choose_fp32_packing()
    assert choice.packs is packs and choice.timings == measured
    path = fp32_packing.choice_path(fp32_packing.CHOICE_NAME)
    assert path.is_file() is kept
    if kept:
        monkeypatch.setattr(fp32_packing, "measure_fp32_products", lambda: pytest.fail("measured again"))
        assert choose_fp32_packing() == choice
        assert json.loads(path.read_text())["packs"] is packs
    assert ("packed for oneDNN" if packs else "left to MKL") in choice.describe()


def test_the_measurement_times_both_libraries_at_each_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fp32_packing, "PROBE_REPEATS", 1)
    measured = fp32_packing.measure_fp32_products()
    assert set(measured) == {"mkl", "onednn"}
    assert all(set(by_rows) == {"1", "4"} and min(by_rows.values()) > 0 for by_rows in measured.values())


@pytest.mark.parametrize(("dtype", "packed"), [("auto", True), ("float32", False)])
def test_only_the_auto_fallback_packs_fp32(monkeypatch: pytest.MonkeyPatch, dtype: str, packed: bool) -> None:
    """On a CPU without native bf16 (flags stubbed), `--dtype auto` packs where oneDNN measured
    faster, draft heads included; `--dtype float32` keeps MKL's exact products unmeasured."""
    monkeypatch.setattr("skipsearch.models.dtypes.cpu_flags", lambda: frozenset({"avx2", "fma"}))
    chosen = Fp32Packing(True, timings(2.0, 1.0))
    monkeypatch.setattr(
        fp32_packing, "choose_fp32_packing", lambda: chosen if dtype == "auto" else pytest.fail()
    )
    loaded = load_model("smollm2-135m", "cpu", dtype, RandomWeights(num_layers=1))
    assert isinstance(loaded.model.model.layers[0].mlp.up_proj, PackedLinear) is packed
    assert ("packed for oneDNN" in loaded.plan) is packed and loaded.plan.startswith("float32")
    head = DraftHead.gather(LayerwiseRunner(loaded.model), [3, 1, 4])
    assert isinstance(head.product, PackedLinear) is packed
