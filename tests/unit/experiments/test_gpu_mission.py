"""`experiments/gpu_mission.py --tiny`: every step of the GPU mission on this CPU with tiny random
models, and a second call that keeps what the first finished instead of running it again."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.conftest import with_shared_kernels

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "experiments" / "gpu_mission.py"
STEPS = ["tests", "weights", "profile", "search", "decodes", "mistral", "hf_compiled"]


def mission(out: Path, work: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), "--tiny", "--out", str(out), "--work", str(work)]
    env = {**os.environ, "SKIPSEARCH_CACHE": str(work / "cache")}  # as the mission sets by default
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )


@pytest.mark.slow
def test_the_tiny_mission_writes_every_step_and_a_rerun_keeps_them(
    tmp_path: Path, shared_kernels: Path
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    with_shared_kernels(work / "cache", shared_kernels)  # built and measured once per session
    done = mission(out, work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "mission.json").read_text())
    steps = report["steps"]
    assert {name: s["status"] for name, s in steps.items()} == dict.fromkeys(STEPS, "ok")
    assert "needs CUDA" in steps["tests"]["data"]["skipped"]  # the GPU-only step says why it did not run
    assert not steps["profile"]["data"]["graphs"] and max(steps["profile"]["data"]["positions"]) == 32
    finalists = steps["search"]["data"]["finalists"]
    assert finalists and all(f["exact_score"] > 0 for f in finalists)
    decoded = steps["decodes"]["data"]["drafts"]
    assert [r["mask"] for r in decoded] == [finalists[0]["mask"]]
    assert decoded[0]["lossless"] and decoded[0]["predicted"] == finalists[0]["exact_score"]
    mistral = steps["mistral"]["data"]
    assert mistral["label"].startswith("PREDICTION") and len(mistral["drafts"]) == 5
    prices = {name: next(iter(row["speedup_at"].values())) for name, row in mistral["drafts"].items()}
    assert prices["int4, no skip"] > prices["int8, no skip"]  # fewer bytes, same tokens per round
    readme = (out / "README.md").read_text()
    assert "Tiny CPU run" in readme and "PREDICTION" in readme and "dequantized" in readme
    assert len(list(out.iterdir())) <= 8  # what the device tool returns from $OUT

    again = mission(out, work)  # a second call, as after a cut: every finished step is kept
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    kept = json.loads((out / "mission.json").read_text())["steps"]
    assert [name for name, s in kept.items() if s.get("kept")] == [n for n in STEPS if n != "weights"]
    assert kept["search"]["data"] == steps["search"]["data"]
