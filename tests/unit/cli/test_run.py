"""Issue 15, redone from the command line: each bad input is one line and exit 2 with nothing left
behind, a torn journal resumes, and what is printed says what was measured.

A tiny Llama saved as a local model directory stands in for the real model: its depth is read
from `config.json` without loading, as the registry gives it for an alias.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from rich.console import Console

from skipsearch.cli import main
from skipsearch.cli.decode_tables import timing_caveats
from skipsearch.cli.models import models_table
from skipsearch.models.registry import REGISTRY
from skipsearch.run import pipeline
from skipsearch.run.report import verdict
from skipsearch.store import JOURNAL_FILE, RUN_FILE
from tests.conftest import make_tokenizer, tiny_model

SMALL = ["--n-prompts", "2", "--new-tokens", "8", "--max-prompt-tokens", "32"]


@pytest.fixture(autouse=True)
def cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SKIPSEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = make_tokenizer()
    tiny_model("llama", layers=6, vocab_size=len(tokenizer)).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def one_line_error(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("skipsearch: error: "), err
    return err


def run_args(model_dir: str, out: Path, *extra: str) -> list[str]:
    return ["run", "--model", model_dir, *SMALL, "--out", str(out), *extra]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--space", "contiguous", "--strategy", "exhaustive", "--budget", "4"], "raise the budget to 5"),
        (["--cost", "calibrated"], "skipsearch profile --model"),
        (["--sampler", "cmaes", "--pareto"], "cmaes"),
    ],
    ids=["exhaustive-beyond-budget", "calibrated-without-profile", "cmaes-pareto"],
)
def test_bad_settings_fail_before_the_model_loads_and_leave_nothing(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch, extra, message
) -> None:
    monkeypatch.setattr(pipeline, "open_context", lambda *a: pytest.fail("the model was loaded"))
    assert message in one_line_error(capsys, *run_args(model_dir, tmp_path / "r", *extra))
    assert not (tmp_path / "r").exists()


def test_a_run_failing_before_its_first_trial_removes_its_directory(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "search_one", interrupted)
    assert main(run_args(model_dir, tmp_path / "r", "--budget", "2")) == 130
    assert not (tmp_path / "r").exists()
    (tmp_path / "kept").mkdir()  # made by someone else: emptied of what the run made, not removed
    assert main(run_args(model_dir, tmp_path / "kept", "--budget", "2")) == 130
    assert list((tmp_path / "kept").iterdir()) == []


@pytest.fixture
def finished_run(model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> Path:
    out = tmp_path / "run"
    assert main(run_args(model_dir, out, "--budget", "3", "--strategy", "random")) == 0
    capsys.readouterr()
    return out


def test_a_torn_journal_resumes_to_the_budget_with_one_line_about_it(
    finished_run: Path, model_dir: str, capsys: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
) -> None:
    journal = finished_run / JOURNAL_FILE
    data = journal.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    journal.write_bytes(data[: (last + len(data)) // 2])  # killed halfway through the last record
    assert main(run_args(model_dir, finished_run, "--budget", "4", "--resume")) == 0
    assert "4 masks scored" in capsys.readouterr().out
    repairs = [r for r in caplog.records if r.name == "skipsearch.search.journal"]
    assert len(repairs) == 1 and f"{JOURNAL_FILE}.torn-1" in repairs[0].getMessage()


def test_resume_refuses_settings_it_would_ignore(
    finished_run: Path, model_dir: str, capsys: pytest.CaptureFixture
) -> None:
    resume = ["run", "--model", model_dir, "--out", str(finished_run), "--resume"]
    err = one_line_error(capsys, *resume, "--space", "contiguous")
    assert "--space contiguous would be ignored" in err and "space='sparse'" in err
    # Typed equal to the default (16) but not to the stored value: refused too, not ignored.
    assert "n_prompts=2" in one_line_error(capsys, *resume, "--n-prompts", "16")


@pytest.mark.parametrize("command", ["report", "export", "run"])
def test_a_damaged_run_yaml_is_one_line(
    finished_run: Path, model_dir: str, capsys: pytest.CaptureFixture, command: str
) -> None:
    (finished_run / RUN_FILE).write_text("config: [unclosed\n  - {")
    args = run_args(model_dir, finished_run, "--resume") if command == "run" else [command, str(finished_run)]
    if command == "export":
        (finished_run / "best.json").unlink()
    assert "damaged" in one_line_error(capsys, *args)


def test_report_and_export_pick_a_study_of_a_compare_directory(
    finished_run: Path, capsys: pytest.CaptureFixture
) -> None:
    """A run directory stands in for a compare one: its one study is `random`."""
    (finished_run / "best.json").unlink()
    assert "random" in one_line_error(capsys, "report", str(finished_run), "--study", "learned-s0")
    assert main(["report", str(finished_run), "--study", "random"]) == 0
    assert (finished_run / "studies" / "random" / "best.json").is_file()
    assert main(["export", str(finished_run), "--study", "random", "--format", "skip-layers"]) == 0
    assert (finished_run / "studies" / "random" / "exports" / "skip_layers.json").is_file()


def test_a_backwards_range_is_refused_before_torch_is_imported(model_dir: str) -> None:
    code = (
        "import sys; from skipsearch.cli import main; "
        f"code = main(['measure', '--model', {model_dir!r}, '--skip', '20-10']); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "runs backwards" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_measure_on_a_missing_cuda_device_is_one_line(model_dir: str, capsys: pytest.CaptureFixture) -> None:
    err = one_line_error(capsys, "measure", "--model", model_dir, "--skip", "2", "--device", "cuda")
    assert "no CUDA device" in err and "--device cpu" in err


def test_decode_warns_on_few_repeats_and_a_busy_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("skipsearch.models.threads.busy_cores", lambda: 0.1)
    assert timing_caveats(3) == []
    assert "only 1 repeat" in timing_caveats(1)[0]
    monkeypatch.setattr("skipsearch.models.threads.busy_cores", lambda: 1.0)
    assert "other processes keep 1.0 of the" in timing_caveats(3)[0]


def test_models_never_cuts_an_alias_at_80_columns() -> None:
    console = Console(width=80, record=True)
    console.print(models_table(REGISTRY.values(), lambda entry: True))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for alias in REGISTRY:
        assert any(alias in line for line in lines), alias


def summary(cost: str) -> dict:
    return {
        "model": "m",
        "mask": "a:" + ",".join(map(str, range(1, 29))) + "|m:" + ",".join(map(str, range(1, 29))),
        "skipped_attn": [1],
        "skipped_mlp": [1],
        "gamma_best": 2,
        "cost": cost,
        "predicted_speedup": {"closed_form": 1.30, "calibrated": 0.72},
        "acceptance": {"alpha": 0.7, "sampling_acceptance": 0.8, "temperature": 1.0},
        "r_draft": 0.5,
        "r_reuse": 0.1,
        "strategy": "learned",
        "seed": 0,
    }


@pytest.mark.parametrize(
    ("cost", "figure", "named"),
    [("closed-form", "1.300x", "closed-form"), ("calibrated", "0.720x", "calibrated")],
)
def test_the_verdict_names_the_cost_model_and_the_mask_has_its_own_line(cost, figure, named) -> None:
    text = verdict(summary(cost), pd.DataFrame({"repeat": [False]}), [])
    assert (
        f"{figure} {'closed form' if cost == 'closed-form' else 'calibrated on this device'} (the cost model"
        in text
    )
    closing = text.split("## Verdict")[1]
    assert named in closing and figure[:4] in closing
    assert f"    {summary(cost)['mask']}" in text.splitlines()
    assert json.dumps(summary(cost))  # the summary stays plain data
