"""`experiments/amx_products.py`: the AMX products kernel against the AVX-512 kernel."""

import subprocess
import sys
from pathlib import Path

import pytest

from skipsearch.cpu.dtypes import cpu_flags
from skipsearch.cpu.native import compiler

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "experiments" / "amx_products.py"
HAS_AMX = {"amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx512bw", "avx512vl"}.issubset(
    cpu_flags() or ()
)


def run(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.skipif(not HAS_AMX or compiler() is None, reason="the AMX kernel needs AMX and a C compiler")
def test_the_amx_kernel_keeps_a_rows_bits_and_reports_both_kernels(tmp_path: Path) -> None:
    done = run("--model", "smollm2-135m", "--repeats", "2", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "amx_products-smollm2-135m.md").read_text()
    assert "Same bits alone and in a block of 5: yes" in report
    rows = [line for line in report.splitlines() if line.startswith("| 1 ") or line.startswith("| 5 ")]
    assert len(rows) == 2 and all(line.count(" ms") == 0 and line.count("(") == 2 for line in rows)


@pytest.mark.skipif(HAS_AMX, reason="this CPU has AMX")
def test_a_cpu_without_amx_is_one_line_exit_2(tmp_path: Path) -> None:
    done = run("--out", str(tmp_path))
    assert done.returncode == 2 and "the AMX kernel needs AMX" in done.stderr.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
