"""`experiments/int_kernels.py`: every configuration runs and is reported (a smoke run: one layer,
one repeat; its times mean nothing)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "experiments" / "int_kernels.py"


@pytest.mark.parametrize("calls", [[], ["--direct"]], ids=["modules", "direct"])
def test_a_smoke_run_reports_every_configuration(tmp_path: Path, calls: list[str]) -> None:
    out = tmp_path / "int.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--layers", "1", "--repeats", "1",
         "--rows", "1,2", "--threads", "1", "--out", str(out), *calls],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = out.read_text()
    for name in ("bf16 ours", "int8 ours", "int4 ours", "int8 torch", "int4 torch"):
        rows = [line for line in report.splitlines() if line.startswith(f"| {name} |")]
        assert len(rows) == 2 or f"Not measured: {name}" in report, name
    assert "Load average" in report and "groups of 64/128" in report


def test_a_fused_smoke_run_reports_whole_steps(tmp_path: Path) -> None:
    """`--fused`: whole steps and the layers alone on fused bf16, int8 and int4 layers."""
    out = tmp_path / "fused.md"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", "smollm2-135m", "--layers", "1", "--repeats", "1",
         "--threads", "1", "--fused", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = out.read_text()
    for passes in ("whole step", "layers only"):
        for name in ("bf16", "int8", "int4"):
            assert sum(line.startswith(f"| {passes} | {name} |") for line in report.splitlines()) == 1
    assert "Load average" in report and "groups of 32" in report and "CPU: " in report
