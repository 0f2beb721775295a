"""`experiments/gpu_real_weights.py --tiny`: every step of the real-weight GPU check, on this CPU
with the embedded model, and the GGUF carried in parts and refused when a part is damaged."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.gguf_parts import MANIFEST, split_file

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "experiments" / "gpu_real_weights.py"


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.slow
def test_the_tiny_real_weight_check_writes_every_step(tmp_path: Path) -> None:
    done = run_script("--tiny", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_real.json").read_text())
    statuses = {name: step["status"] for name, step in report["steps"].items()}
    assert statuses == dict.fromkeys(["profile", "decodes", "hf_compiled"], "ok")
    decodes = report["steps"]["decodes"]["data"]
    assert [row["vocab"] for row in decodes["drafts"]] == [None, 4096]
    for row in decodes["drafts"]:
        assert row["lossless_passed"] and row["predicted_speedup"] > 0 and row["measured_speedup"] > 0
    assert decodes["baselines"]["autoregressive-graphs"]["same_tokens_as_eager_autoregressive"]
    compiled = report["steps"]["hf_compiled"]["data"]  # off a GPU generate compiles nothing
    assert compiled["dynamo_graphs"] == 0 and compiled["same_tokens_as_graphed_autoregressive"]
    assert "Tiny CPU run" in (tmp_path / "README.md").read_text()
    readme = (tmp_path / "README.md").read_text()
    assert run_script("--render", "--out", str(tmp_path)).returncode == 0  # the report again, from its JSON
    assert (tmp_path / "README.md").read_text() == readme
    assert len(list(tmp_path.iterdir())) <= 8  # what the device tool returns from $OUT


def test_a_damaged_part_is_refused_in_one_line(tmp_path: Path) -> None:
    source = tmp_path / "model.gguf"
    source.write_bytes(bytes(range(256)) * 64)
    parts = tmp_path / "parts"
    split_file(source, parts, part_bytes=5000)
    manifest = json.loads((parts / MANIFEST).read_text())
    damaged = parts / manifest["parts"][1]["file"]
    damaged.write_bytes(b"x" + damaged.read_bytes()[1:])
    done = run_script("--tiny", "--gguf-parts", str(parts), "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "sha256" in done.stderr
    assert not (tmp_path / "out").exists()
