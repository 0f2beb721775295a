"""`skipsearch measure`: bad inputs are one line on stderr and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    SMALL,
    one_line_error,
    synthetic_latency,
)

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


class Payload:
    """Unpickles as a call (harmless here), as a malicious weight file would."""

    def __reduce__(self) -> tuple:
        return (os.getpid, ())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_measure_on_a_missing_cuda_device_is_one_line(model_dir: str, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "measure", "--model", model_dir, "--skip", "2", "--device", "cuda")
    assert "no CUDA device" in err and "--device cpu" in err


# -- tracebacks ------------------------------------------------------------------------------------
def test_a_truncated_gguf_and_a_pickled_payload_are_one_line(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    gguf = tmp_path / "bad.gguf"
    gguf.write_bytes(b"GGUF" + bytes(18))  # 22 bytes: the magic, then a header cut short
    assert "truncated" in one_line_error(capsys, "measure", "--model", str(gguf), "--skip", "1")
    evil = tmp_path / "evil"
    evil.mkdir()
    for path in Path(model_dir).iterdir():
        if path.suffix != ".safetensors":
            (evil / path.name).write_bytes(path.read_bytes())
    torch.save({"weight": Payload()}, evil / "pytorch_model.bin")
    assert "safetensors" in one_line_error(capsys, "measure", "--model", str(evil), "--skip", "1", *SMALL)


def test_a_mask_in_neither_form_hints_at_the_a_m_form(capsys: pytest.CaptureFixture) -> None:
    assert "a:4,14|m:4,14,20" in one_line_error(capsys, "measure", "--mask", "zz:1,2|q")


@pytest.mark.slow
def test_measure_refuses_an_out_of_range_context_in_one_line(tmp_path: Path) -> None:
    synthetic_latency(tmp_path)
    command = [
        sys.executable, "-m", "skipsearch", "measure", "--skip", "3", "--context", "4096",
        "--latency-profile", str(tmp_path / "profile.json"),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--extrapolate-context" in lines[0]
