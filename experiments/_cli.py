"""Run `skipsearch` the way a user does, in a child process.

Experiments drive the command line but never import `skipsearch.cli` (an import-linter contract in
pyproject.toml): the CLI is the top layer, and a child process also starts from a clean
interpreter, as every real run does.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence


def skipsearch(args: Sequence[str]) -> int:
    """`skipsearch ARGS` with this interpreter; its exit code (output goes to this terminal)."""
    return subprocess.run([sys.executable, "-m", "skipsearch", *args], check=False).returncode
