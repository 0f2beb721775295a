"""`experiments/gpu_check.py --tiny`: every section of the prepared GPU check, end to end on this CPU.

The GPU machine has no optuna, gguf or ray; the script is run with them made unimportable, so a
new import of one of them fails here instead of costing a GPU session.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

BLOCKED = (
    "import runpy, sys; sys.modules.update(optuna=None, gguf=None, ray=None); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)


@pytest.mark.slow
def test_the_tiny_gpu_check_writes_every_section(tmp_path: Path) -> None:
    script = ROOT / "experiments" / "gpu_check.py"
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(script), "--tiny", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    sections = report["sections"]
    assert {name: s["status"] for name, s in sections.items()} == dict.fromkeys(
        ["tests", "profiles", "engine_vs_hf", "estimator", "predictions", "graphed"], "ok"
    )
    assert sections["tests"]["data"]["counts"].get("skipped", 0) > 0  # the CUDA tests, counted
    assert sections["engine_vs_hf"]["data"]["lossless"]["passed"]
    assert set(sections["estimator"]["data"]["modes"]) == {"self", "shared-kv", "rounds"}
    graphed = sections["graphed"]["data"]["models"]["Mistral-7B"]["masks"]
    assert [name.split()[0] for name in graphed] == ["exit"] * 3  # no CPU-measured mask has its shape
    assert all(row["draft_cost"] > 0 and len(row["verify_cost"]) == 2 for row in graphed.values())
    smollm = sections["predictions"]["data"]["SmolLM2-135M"]
    assert smollm and all(len(row["gpu_speedup"]["8"]) == 8 for row in smollm)
    readme = (tmp_path / "README.md").read_text()
    assert "Tiny CPU run" in readme and "## predictions — ok" in readme
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool returns from $OUT
