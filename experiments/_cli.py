"""Run `skipsearch` the way a user does, in a child process.

Experiments drive the command line but never import `skipsearch.cli` (an import-linter contract in
pyproject.toml): the CLI is the top layer, and a child process also starts from a clean
interpreter, as every real run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def skipsearch(args: Sequence[str]) -> int:
    """`skipsearch ARGS` with this interpreter; its exit code (output goes to this terminal)."""
    return subprocess.run([sys.executable, "-m", "skipsearch", *args], check=False).returncode


def decode_json(args: Sequence[str], out: Path) -> dict:
    """`skipsearch decode ARGS --json OUT`: its JSON, with the 1-minute load average before and
    after (a decode that ran but was not lossless exits 1 and is reported, not raised)."""
    before = os.getloadavg()[0]
    if skipsearch([*args, "--json", str(out)]) not in (0, 1):
        raise SystemExit(f"skipsearch {' '.join(args)} failed")
    return {**json.loads(out.read_text()), "load_before": before, "load_after": os.getloadavg()[0]}
