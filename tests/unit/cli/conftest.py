"""`skipsearch` in a fresh process and the check that it failed in one line: shared by the command-line
tests here and in tests/integration/."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skipsearch import cli

VOCAB_SMALL = ["--n-prompts", "3", "--new-tokens", "16", "--max-prompt-tokens", "96"]


def skipsearch(*args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "skipsearch", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


SUBPROCESS_SMALL = ["--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "64"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return skipsearch("run", *args, *SUBPROCESS_SMALL)


def assert_one_line_error(result: subprocess.CompletedProcess, message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


@pytest.fixture
def only_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register only the `profile` command, so its tests do not depend on the other commands' imports."""
    monkeypatch.setattr(cli, "COMMANDS", ("profile",))
