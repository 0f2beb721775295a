"""`skipsearch run` on two Ray workers finishes its budget."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from tests.unit.executors.conftest import MARKER, assert_ray_gone


# -- the real model, through the CLI -----------------------------------------------------------
def test_cli_run_on_two_ray_workers_finishes_its_budget(tmp_path: Path) -> None:
    import pandas as pd

    tag, out = uuid.uuid4().hex, tmp_path / "run"
    command = [
        *(sys.executable, "-m", "skipsearch", "run", "--executor", "ray", "--workers", "2"),
        *("--budget", "12", "--n-prompts", "4", "--new-tokens", "16", "--max-prompt-tokens", "96"),
        *("--out", str(out)),
    ]
    env = {**os.environ, MARKER: tag}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ray: 2 CPU worker(s)" in done.stderr
    trials = pd.read_csv(out / "trials.csv")
    unique = trials[~trials["repeat"]]
    assert len(unique) == 12 and unique["mask"].nunique() == 12
    assert_ray_gone(tag)
