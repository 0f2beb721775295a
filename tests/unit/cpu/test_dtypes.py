"""The automatic dtype: bf16 where the CPU has native bf16, else fp32, and what decides it."""

from pathlib import Path

import pytest

from skipsearch.cpu.dtypes import choose_dtype, cpu_flags

AVX512_BF16 = frozenset({"avx512f", "avx512_bf16", "fma"})

NO_BF16 = frozenset({"avx2", "fma", "avx512f"})


# -- the dtype ------------------------------------------------------------------------------------
def test_auto_is_bf16_on_a_cpu_with_native_bf16() -> None:
    choice = choose_dtype("cpu", "auto", AVX512_BF16)
    assert choice.name == "bfloat16" and "avx512_bf16" in choice.reason
    assert choose_dtype("cpu", "auto", frozenset({"amx_bf16"})).name == "bfloat16"


def test_a_cpu_without_native_bf16_falls_back_to_fp32_and_says_so() -> None:
    choice = choose_dtype("cpu", "auto", NO_BF16)
    assert choice.name == "float32"
    assert "no native bf16" in choice.reason and "avx512_bf16" in choice.reason


def test_unreadable_flags_fall_back_to_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skipsearch.cpu.dtypes.cpu_flags", lambda: None)
    choice = choose_dtype("cpu", "auto")
    assert choice.name == "float32" and "could not be read" in choice.reason


def test_an_explicit_dtype_and_an_accelerator_are_not_second_guessed() -> None:
    assert choose_dtype("cpu", "float32", AVX512_BF16).name == "float32"
    assert choose_dtype("cpu", "torch.bfloat16", NO_BF16).name == "bfloat16"
    assert choose_dtype("cuda", "auto", NO_BF16).name == "bfloat16"


def test_cpu_flags_are_read_from_the_kernels_report(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu avx512_bf16 fma\n\n")
    assert cpu_flags(cpuinfo) == frozenset({"fpu", "avx512_bf16", "fma"})
    assert cpu_flags(tmp_path / "missing") is None
