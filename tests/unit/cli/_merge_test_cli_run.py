"""`skipsearch run` rejects bad input with one line and exit 2, and writes nothing."""

import subprocess
import sys

import pytest

SMALL = ["--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "64"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "skipsearch", "run", *args, *SMALL]
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def assert_one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_unknown_space(tmp_path):
    result = run_cli("--space", "no-such-space", "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "no-such-space")
    assert not (tmp_path / "r").exists()


def test_budget_must_be_positive(tmp_path):
    result = run_cli("--budget", "0", "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "budget")
    assert not (tmp_path / "r").exists()


def test_existing_run_directory_needs_resume(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "run.yaml").write_text("keep me")
    result = run_cli("--out", str(out))
    assert_one_line_error(result, "--resume")
    assert (out / "run.yaml").read_text() == "keep me"


@pytest.mark.integration
def test_infeasible_constraints_fail_before_anything_is_written(tmp_path):
    space = tmp_path / "infeasible.yaml"
    space.write_text("kind: sparse\nr_draft_min: 0.3\nr_draft_max: 0.35\nmax_skipped: 2\n")
    result = run_cli("--space", str(space), "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "r_draft")
    assert not (tmp_path / "r").exists()
