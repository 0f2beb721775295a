"""`experiments/kernel_builds.py`: a kernel's build at a git revision against the working tree's."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skipsearch.cpu import decode_attention

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "experiments" / "kernel_builds.py"


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.skipif(
    decode_attention.load_kernel(torch.float32).function is None,
    reason="the fp32 decode kernel does not load here",
)
def test_the_committed_attention_kernel_gives_the_working_trees_bits(tmp_path: Path) -> None:
    done = run(
        "--kernel", "attention", "--against", "HEAD", "--keys", "40,300", "--queries", "1,3",
        "--repeats", "2", "--out", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "builds-attention-smollm2-135m.md").read_text()
    cases = [
        line for line in report.splitlines() if line.startswith("| 40 keys") or line.startswith("| 300 keys")
    ]
    assert len(cases) == 4
    assert all(line.rstrip(" |").endswith("yes") for line in cases), report


def test_a_revision_without_the_kernel_is_one_line_exit_2_and_no_report(tmp_path: Path) -> None:
    done = run("--kernel", "attention", "--against", "no-such-revision", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "decode_attention_fp32.c is not at revision 'no-such-revision'" in done.stderr.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
