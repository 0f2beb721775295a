"""A CPU with native bf16 runs `--dtype auto` in bf16, or on the fallback plan's float32 activations
where those measure faster (`cpu.bf16_activations`): measured once per machine, and only there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from skipsearch.cpu import bf16_activations, fp32_linear
from skipsearch.cpu.bf16_activations import BF16, FLOAT32, ActivationChoice, choose_activations
from skipsearch.cpu.bf16_weights import Bf16WeightLinear
from skipsearch.cpu.bf16_weights import load_kernel as load_linear_kernel
from skipsearch.cpu.fp32_linear import BF16_KERNEL, Fp32Linear
from skipsearch.cpu.packed import PackedLinear
from skipsearch.models.loading import dtype_choice, load_model
from skipsearch.models.random_weights import RandomWeights

needs_both = pytest.mark.skipif(
    load_linear_kernel().function is None or not torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    reason="the bf16-weight kernel or oneDNN's bf16 does not run here",
)
NATIVE_BF16 = frozenset({"avx2", "fma", "avx512f", "amx_bf16"})


def timings(bf16: float, float32: float) -> dict[str, dict[str, float]]:
    return {BF16: {"1": bf16, "4": bf16}, FLOAT32: {"1": float32, "4": 1.2 * float32}}


@needs_both
@pytest.mark.parametrize(
    ("measured", "chosen"),
    [(timings(500, 330), FLOAT32), (timings(300, 500), BF16), (timings(500, 440), BF16)],
    ids=["kernel faster", "oneDNN faster", "alike: bf16 stays"],
)
def test_float32_activations_run_only_where_they_lead_and_the_choice_is_kept(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch, measured: dict, chosen: str
) -> None:
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: measured)
    choice = choose_activations()
    assert choice.activations == chosen and choice.timings == measured
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: pytest.fail("measured again"))
    assert choose_activations() == choice
    assert bf16_activations.PLAN_NAMES[chosen] in choice.describe()


@needs_both
def test_a_choice_made_with_another_kernel_build_is_measured_again(
    cache_in_tmp: Path, idle_cpu: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: timings(500, 330))
    choose_activations()
    path = bf16_activations.choice_path(bf16_activations.CHOICE_NAME)
    path.write_text(json.dumps({**json.loads(path.read_text()), "kernel_build": "an older one"}))
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: timings(300, 500))
    assert choose_activations().activations == BF16


def test_a_choice_measured_beside_busy_cores_is_not_kept_but_holds_for_the_process(
    cache_in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if load_linear_kernel().function is None or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert choose_activations().activations == BF16  # nothing to measure: the bf16 plan
        return
    monkeypatch.setattr("skipsearch.cpu.choices.busy_cores", lambda: 1.0)
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: timings(500, 330))
    assert choose_activations().activations == FLOAT32
    assert not bf16_activations.choice_path(bf16_activations.CHOICE_NAME).exists()
    monkeypatch.setattr(bf16_activations, "measure_layer_products", lambda: pytest.fail("measured again"))
    assert choose_activations().activations == FLOAT32  # one answer for the rest of this process


@needs_both
def test_the_measurement_times_both_plans_at_each_row_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bf16_activations, "PROBE_REPEATS", 1)
    monkeypatch.setattr(bf16_activations, "PROBE_LAYERS", 1)
    measured = bf16_activations.measure_layer_products()
    assert set(measured) == {BF16, FLOAT32}
    assert all(set(by_rows) == {"1", "4"} and min(by_rows.values()) > 0 for by_rows in measured.values())


@pytest.mark.parametrize("activations", [BF16, FLOAT32])
def test_auto_on_a_native_bf16_cpu_runs_the_measured_plan(
    monkeypatch: pytest.MonkeyPatch, activations: str
) -> None:
    """The flags say native bf16 (stubbed); the measured activations decide the dtype and the plan,
    and the plan line says why. An explicit dtype is not measured."""
    monkeypatch.setattr("skipsearch.cpu.dtypes.cpu_flags", lambda: NATIVE_BF16)
    choice = ActivationChoice(activations, timings(500, 330 if activations == FLOAT32 else 600))
    monkeypatch.setattr(bf16_activations, "choose_activations", lambda: choice)
    monkeypatch.setattr(fp32_linear, "choose_fp32_linear", lambda: Fp32Linear(BF16_KERNEL))
    expected = {BF16: "bfloat16", FLOAT32: "float32"}[activations]
    assert dtype_choice("cpu", "auto").name == expected
    loaded = load_model("smollm2-135m", "cpu", "auto", RandomWeights(num_layers=1))
    assert loaded.plan.details.startswith(
        f"{expected} (--dtype auto: this CPU multiplies bf16 natively (amx_bf16)"
    )
    assert choice.describe() in loaded.plan.details
    up = loaded.model.model.layers[0].mlp.up_proj
    if activations == BF16:
        assert isinstance(up, PackedLinear) or not torch.ops.mkldnn._is_mkldnn_bf16_supported()
    elif load_linear_kernel().function is not None:
        assert isinstance(up, Bf16WeightLinear) and up.packed.dtype == torch.bfloat16
    monkeypatch.setattr(bf16_activations, "choose_activations", lambda: pytest.fail("measured"))
    assert dtype_choice("cpu", "bfloat16").name == "bfloat16"
    assert dtype_choice("cpu", "float32").name == "float32"
    assert dtype_choice("cuda", "auto").name == "bfloat16"
