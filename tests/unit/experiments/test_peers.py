"""`experiments/peers.py`: llama-bench's command line, its JSON read into the table, and the refusal
without a compiler; no build here (that is ~10 minutes)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = ROOT / "experiments"

# What llama-bench -o json prints for `-p 0 -n 128 -d 256 -r 3` (fields trimmed to those read and a few
# beside them), with a prompt test that is not a decode test and must be left out.
BENCH_JSON = [
    {
        "build_commit": "abc1234", "cpu_info": "some CPU", "model_filename": "/m/SmolLM2.Q4_1.gguf",
        "model_type": "llama 135M Q4_1", "model_size": 98000000, "n_threads": 2, "n_prompt": 512,
        "n_gen": 0, "n_depth": 0, "avg_ts": 900.0, "stddev_ts": 5.0, "samples_ts": [895.0, 905.0],
    },
    {
        "build_commit": "abc1234", "cpu_info": "some CPU", "model_filename": "/m/SmolLM2.Q4_1.gguf",
        "model_type": "llama 135M Q4_1", "model_size": 98000000, "n_threads": 2, "n_prompt": 0,
        "n_gen": 128, "n_depth": 256, "avg_ts": 100.0, "stddev_ts": 2.0, "samples_ts": [98.0, 100.0, 102.0],
    },
]  # fmt: skip


@pytest.fixture
def peers(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the experiment imports its helpers as scripts do
    return importlib.import_module("peers")


def test_the_bench_command_decodes_at_depth_without_a_prompt_test(peers: ModuleType) -> None:
    argv = peers.bench_argv(Path("/b/llama-bench"), Path("/m/x.gguf"), 2, 256, 128, 5)
    assert argv == [
        "/b/llama-bench", "-m", "/m/x.gguf", "-t", "2", "-p", "0", "-n", "128", "-d", "256", "-r", "5",
        "-o", "json",
    ]  # fmt: skip


def test_the_table_reads_llama_benchs_json(peers: ModuleType) -> None:
    qwen = {**BENCH_JSON[1], "model_type": "qwen2 0.5B Q4_K - Medium"}
    assert peers.parse_bench(json.dumps([qwen]), "qwen")[0].gguf_type == "Q4_K - Medium"
    rows = peers.parse_bench(json.dumps(BENCH_JSON), "smollm2-135m")
    assert len(rows) == 1
    row = rows[0]
    assert (row.model, row.gguf_type, row.context, row.new_tokens, row.threads) == (
        "smollm2-135m", "Q4_1", 256, 128, 2,
    )  # fmt: skip
    assert row.mean == pytest.approx(100.0) and row.std == pytest.approx(2.0)
    flags = frozenset({"avx2", "fma", "sse4_2", "avx512f", "ht"})
    lines = peers.table(rows, "Some CPU (AVX2, AVX-512, no AMX)", flags, (1.0, 2.0, 3.0), (4.0, 5, 6), "cmd")
    text = "\n".join(lines)
    assert "| smollm2-135m | Q4_1 | 256 | 128 | 2 | 3 | 100.0 ± 2.0 |" in lines
    assert "Some CPU (AVX2, AVX-512, no AMX); vector flags: avx2 avx512f fma sse4_2." in text
    assert "before: 1.00, 2.00, 3.00; after: 4.00, 5.00, 6.00" in text and "`cmd`" in text
    assert "0.3.36" in lines[0]


def test_output_that_is_not_json_is_a_refusal(peers: ModuleType) -> None:
    with pytest.raises(peers.Refusal, match="printed no JSON"):
        peers.parse_bench("error: failed to load model", "m")


def test_the_build_is_keyed_by_version_and_cpu_flags(peers: ModuleType, tmp_path: Path) -> None:
    one = peers.build_dir(tmp_path, frozenset({"avx2"}))
    assert one == peers.build_dir(tmp_path, frozenset({"avx2"}))
    assert one != peers.build_dir(tmp_path, frozenset({"avx2", "avx512f"}))
    assert one.name.startswith(f"llama.cpp-{peers.LLAMA_CPP_PYTHON}-")


def test_without_a_compiler_it_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX")}
    env.update(PATH=str(tmp_path), PYTHONPATH=str(ROOT), SKIPSEARCH_CACHE=str(tmp_path / "cache"))
    done = subprocess.run(
        [sys.executable, str(EXPERIMENTS / "peers.py"), "--build-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "cannot build llama.cpp: no cc, c++, cmake, ninja (or make) on PATH" in done.stderr
    assert not (tmp_path / "cache" / "peers").exists()


def test_bad_options_are_refused(peers: ModuleType, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        peers.parse_args(["--repeats", "0"])
    assert stop.value.code == 2 and "--repeats must be >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(peers.Refusal, match="mistral-7b has no GGUF in the registry"):
        peers.model_ggufs(["mistral-7b"])
