"""`run --graphs` and `compare --graphs`: every candidate scored under the LatencyProfile of CUDA-graph
replays (`profile --graphs`), refused in one line off a GPU before anything is written, and refused
in one line naming `profile --graphs` where no graphed profile of the model exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from skipsearch.cli import main
from skipsearch.models.loading import dtype_name
from skipsearch.store import BEST_FILE, FINALISTS_FILE, RUN_FILE, default_profile_path
from tests.unit.conftest import SMALL, one_line_error, rows_latency, run_args


def test_compare_with_graphs_off_a_gpu_is_one_line_and_writes_nothing(
    model_dir: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    out = tmp_path / "c"
    err = one_line_error(capsys, "compare", "--model", model_dir, *SMALL, "--out", str(out), "--graphs")
    assert "CUDA graphs need a GPU, and --device is cpu: use --device cuda, or drop --graphs" in err
    assert not out.exists()


@pytest.fixture
def graphs_anywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU check stood in, so the graphed scoring runs on this CPU with a stored graphed profile."""
    monkeypatch.setattr("skipsearch.config.check_graphs", lambda device: None)


def test_without_a_graphed_profile_the_run_names_profile_graphs(
    model_dir: str, capsys: pytest.CaptureFixture, tmp_path: Path, cache_in_tmp: Path, graphs_anywhere: None
) -> None:
    eager = default_profile_path(model_dir, "cpu", dtype_name("cpu", "auto"))
    rows_latency(0.1, layers=6).save(eager)  # an eager profile does not stand for the graphed one
    err = one_line_error(capsys, *run_args(model_dir, tmp_path / "r", "--graphs"))
    assert "--graphs needs a latency profile" in err and "--graphs` first" in err
    assert not (tmp_path / "r").exists()


def test_a_graphed_run_scores_and_rescores_under_the_graphed_profile(
    model_dir: str, tmp_path: Path, cache_in_tmp: Path, graphs_anywhere: None
) -> None:
    dtype = dtype_name("cpu", "auto")
    graphed = default_profile_path(model_dir, "cpu", dtype, graphs=True)
    rows_latency(0.1, layers=6).save(graphed)
    out = tmp_path / "r"
    assert main(run_args(model_dir, out, "--graphs", "--budget", "2", "--strategy", "random")) == 0
    stored = yaml.safe_load((out / RUN_FILE).read_text())
    assert stored["config"]["graphs"] and stored["config"]["cost"] == "calibrated"
    assert stored["provenance"]["latency_profile"] == str(graphed)
    finalists = json.loads((out / FINALISTS_FILE).read_text())  # re-scored by the same scorer
    best = json.loads((out / BEST_FILE).read_text())
    assert finalists and best["mask"] == finalists[0]["mask"]  # the verdict's draft is the best re-scored
