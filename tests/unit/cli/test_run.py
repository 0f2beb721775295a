"""`skipsearch run` from the command line (issues 15 and 20): each bad input is one line and exit 2
with nothing left behind, a torn journal resumes, a resume keeps the stored settings, and nothing
outside the run directory is written through it.

A tiny Llama saved as a local model directory stands in for the real model: its depth is read
from `config.json` without loading, as the registry gives it for an alias.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from skipsearch.cli import main
from skipsearch.config import RunConfig
from skipsearch.masks import KVPattern
from skipsearch.run import owner, pipeline
from skipsearch.search.journal import repair_journal
from skipsearch.store import JOURNAL_FILE, RUN_FILE, cache_dir
from tests.unit.cli.conftest import VOCAB_SMALL, assert_one_line_error, run_cli, skipsearch
from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    SMALL,
    one_line_error,
    run_args,
)

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--space", "contiguous", "--strategy", "exhaustive", "--budget", "4"], "raise the budget to 5"),
        (["--cost", "calibrated"], "skipsearch profile --model"),
        (["--sampler", "cmaes", "--pareto"], "cmaes"),
        (["--kv-window", "6"], "give --context N"),
        (["--kv-window", "6", "--context", "64"], "pass --max-prompt-tokens 64"),
        (["--kv-window", "0", "--context", "32"], "pass --kv-window 1 or more"),
        (["--kv-sink", "2", "--context", "32"], "--kv-sink needs --kv-window"),
    ],
    ids=[
        "exhaustive-beyond-budget",
        "calibrated-without-profile",
        "cmaes-pareto",
        "kv-pattern-without-context",
        "kv-pattern-beyond-the-prompts",
        "kv-window-0",
        "kv-sink-alone",
    ],
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


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["measure", "--model", "MODEL", "--skip", "20-10"], "runs backwards"),
        (["plan", "--model", "many"], "unknown model 'many'"),  # not after a minute of imports
    ],
)
def test_a_bad_setting_is_refused_before_torch_is_imported(
    model_dir: str, argv: list[str], says: str
) -> None:
    argv = [model_dir if arg == "MODEL" else arg for arg in argv]
    code = (
        "import sys; from skipsearch.cli import main; "
        f"code = main({argv!r}); "
        "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and says in result.stderr


# -- a resume keeps the stored budget --------------------------------------------------------------
def test_resume_without_budget_finishes_at_the_stored_budget(
    finished_run: Path, model_dir: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["run", "--model", model_dir, "--out", str(finished_run), "--resume"]) == 0
    assert "3 masks scored" in capsys.readouterr().out
    assert "budget: 3" in (finished_run / RUN_FILE).read_text()


def test_compare_resume_without_budget_keeps_the_stored_budget(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "compare"
    compare = [
        "compare",
        "--model",
        model_dir,
        *SMALL,
        "--strategies",
        "random",
        "--seeds",
        "1",
        "--out",
        str(out),
    ]
    assert main([*compare, "--budget", "2"]) == 0
    assert main([*compare, "--resume"]) == 0
    capsys.readouterr()
    assert "budget: 2" in (out / RUN_FILE).read_text()


# -- nothing outside the run is written through it -------------------------------------------------
@pytest.mark.parametrize("linked", [JOURNAL_FILE, "cache/evaluations.jsonl"])
def test_a_run_whose_files_are_symlinks_writes_nothing_outside(
    finished_run: Path, model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, linked: str
) -> None:
    outside = tmp_path / "outside.txt"
    inside = finished_run / linked
    data = inside.read_bytes()
    outside.write_bytes(data[: len(data) - 7])  # torn: the journal repair would cut it
    inside.unlink()
    inside.symlink_to(outside)
    before = digest(outside)
    assert "symbolic link" in one_line_error(
        capsys, *run_args(model_dir, finished_run, "--budget", "5", "--resume")
    )
    assert "symbolic link" in one_line_error(capsys, "report", str(finished_run))
    assert digest(outside) == before


# -- --out must be new, empty or a run -------------------------------------------------------------
def test_out_that_is_not_new_empty_or_a_run_is_refused_before_the_model_loads(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pipeline, "open_context", lambda *a: pytest.fail("the model was loaded"))
    root = sorted(os.listdir("/"))
    assert "not empty and holds no run" in one_line_error(capsys, *run_args(model_dir, Path("/")))
    assert sorted(os.listdir("/")) == root
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text("print('mine')\n")
    assert "not empty" in one_line_error(capsys, *run_args(model_dir, tmp_path / "src"))
    (tmp_path / "file").write_text("x")
    assert "is a file, not a directory" in one_line_error(
        capsys, *run_args(model_dir, tmp_path / "file" / "run")
    )
    assert [p.name for p in (tmp_path / "src").iterdir()] == ["main.py"]


def test_an_unwritable_out_is_one_line_before_the_model_loads(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests run as root, whom a read-only mode does not stop: the refusal is what the OS says."""
    monkeypatch.setattr(pipeline, "open_context", lambda *a: pytest.fail("the model was loaded"))

    def read_only(path: object, *args: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(owner.os, "open", read_only)
    assert "cannot be written" in one_line_error(capsys, *run_args(model_dir, tmp_path / "ro"))
    assert not (tmp_path / "ro").exists()


# -- prompts against the model's context -----------------------------------------------------------
def test_a_prompt_beyond_the_context_is_one_line_and_leaves_no_reference(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The tiny model's context is 256 tokens; humaneval prompts are longer in its tokenizer."""
    args = ["measure", "--model", model_dir, "--skip", "1", "--n-prompts", "2", "--max-prompt-tokens", "250"]
    assert "context of 256 tokens" in one_line_error(capsys, *args)
    assert not (cache_dir() / "reference").exists() or not any((cache_dir() / "reference").iterdir())


# -- wrong or missing words ------------------------------------------------------------------------
@pytest.mark.parametrize("context", ["0", "-5"])
def test_context_below_one_is_refused_even_with_extrapolation(
    model_dir: str, capsys: pytest.CaptureFixture, context: str
) -> None:
    args = ["measure", "--model", model_dir, "--skip", "1", "--context", context, "--extrapolate-context"]
    err = one_line_error(capsys, *args)
    assert "pass --context 1 or more" in err and "--extrapolate-context" not in err.split(":", 2)[-1]


def test_graphs_off_a_gpu_are_one_line_before_the_model_loads(
    model_dir: str, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    err = one_line_error(capsys, *run_args(model_dir, tmp_path / "r", "--graphs"))
    assert "CUDA graphs need a GPU, and --device is cpu: use --device cuda, or drop --graphs" in err
    assert not (tmp_path / "r").exists()


def test_a_journal_damaged_in_the_middle_says_so(
    finished_run: Path, caplog: pytest.LogCaptureFixture
) -> None:
    journal = finished_run / JOURNAL_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    lines[2] = b"{not json\n"
    journal.write_bytes(b"".join(lines))
    with caplog.at_level(logging.WARNING, logger="skipsearch.search.journal"):
        repair_journal(journal)
    message = caplog.records[-1].getMessage()
    assert (
        "damaged in the middle" in message and "torn record" not in message and f"of {len(lines)}" in message
    )


def test_the_empty_prompt_warning_prints_once(
    model_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "#"}\n')
    args = ["decode", "--model", model_dir, "--skip", "1", "--prompts", str(prompts), "--n-prompts", "2"]
    assert main([*args, "--new-tokens", "8", "--max-prompt-tokens", "32", "--repeats", "1"]) == 0
    capsys.readouterr()
    assert sum("zero tokens" in r.getMessage() for r in caplog.records) == 1


def test_unknown_space(tmp_path):
    result = run_cli("--space", "no-such-space", "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "no-such-space")
    assert not (tmp_path / "r").exists()


def test_budget_must_be_positive(tmp_path):
    result = run_cli("--budget", "0", "--out", str(tmp_path / "r"))
    assert_one_line_error(result, "budget")
    assert not (tmp_path / "r").exists()


def test_existing_run_directory_needs_resume(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "run.yaml").write_text("keep me")
    result = run_cli("--out", str(out))
    assert_one_line_error(result, "--resume")
    assert (out / "run.yaml").read_text() == "keep me"


@pytest.mark.parametrize("value", ["0", "many", "-5", "2.5"])
def test_a_bad_draft_vocabulary_is_one_line_before_the_model_loads(value: str, tmp_path: Path) -> None:
    result = skipsearch("measure", "--skip", "14", "--draft-vocab", value, *VOCAB_SMALL)
    assert_one_line_error(result, f"--draft-vocab {value if value.lstrip('-').isdigit() else repr(value)} ")
    run = skipsearch("run", "--draft-vocab", value, "--out", str(tmp_path / "r"), *VOCAB_SMALL)
    assert_one_line_error(run, "--draft-vocab")
    assert not (tmp_path / "r").exists()


KV_SPACE = "kind: sparse\nkv: [full, s1w6]\n"


def test_a_run_scores_each_mask_with_each_kv_pattern_and_says_which_wins(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Prompts of 32 tokens, priced at a context of 32, the pattern reading 7 of them."""
    space = tmp_path / "kv.yaml"
    space.write_text(KV_SPACE)
    out = tmp_path / "r"
    extra = ("--space", str(space), "--context", "32", "--budget", "3", "--strategy", "random")
    assert main(run_args(model_dir, out, *extra)) == 0
    best = json.loads((out / "best.json").read_text())
    assert best["kv"] in ("full", "s1w6") and set(best["score_by_kv"]) == {"full", "s1w6"}
    assert max(best["score_by_kv"].values()) == pytest.approx(best["score"])
    finalist_patterns = {f["kv"] for f in best["finalists"]}
    assert finalist_patterns and finalist_patterns <= {"full", "s1w6"}
    assert "with each KV pattern full" in (out / "summary.md").read_text()
    assert RunConfig.load(out / RUN_FILE)[0].kv == (None, KVPattern(1, 6))


# -- a space file's settings reach the search -------------------------------------------------------
def test_a_space_files_gamma_bounds_reach_the_search_and_run_yaml(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A space that allows only γ = 4 scores every mask at 4 (the audit's run reported 1, with 8 in
    run.yaml); a --gamma-max below its gamma_min is one line, before anything is written."""
    space = tmp_path / "g4.yaml"
    space.write_text("kind: sparse\ngamma_min: 4\ngamma_max: 4\n")
    out = tmp_path / "r"
    assert main(run_args(model_dir, out, "--space", str(space), "--budget", "2", "--strategy", "random")) == 0
    capsys.readouterr()
    config = RunConfig.load(out / RUN_FILE)[0]
    assert (config.gamma_min, config.gamma_max) == (4, 4)
    assert json.loads((out / "best.json").read_text())["gamma_best"] == 4
    err = one_line_error(
        capsys, *run_args(model_dir, tmp_path / "r3", "--space", str(space), "--gamma-max", "3")
    )
    assert "--gamma-max 3 is below the space's gamma_min=4" in err and "pass --gamma-max 4 or more" in err
    assert not (tmp_path / "r3").exists()


def test_an_interrupt_before_the_first_trial_says_nothing_was_kept(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "search_one", interrupted)
    assert main(run_args(model_dir, tmp_path / "r", "--budget", "2")) == 130
    assert "no trial had finished, so nothing was kept" in capsys.readouterr().err


def test_a_journal_of_records_that_are_no_operations_is_refused_before_the_model_loads(
    finished_run: Path, model_dir: str, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole JSON that Optuna cannot replay (a KeyError in its reader): one line naming the file,
    before the model loads and before run.yaml is rewritten."""
    monkeypatch.setattr(pipeline, "open_context", lambda *a: pytest.fail("the model was loaded"))
    (finished_run / JOURNAL_FILE).write_text('{"op_code": 0}\n')
    before = digest(finished_run / RUN_FILE)
    err = one_line_error(capsys, "run", "--model", model_dir, "--out", str(finished_run), "--resume")
    assert "optuna.journal is damaged: a record is whole JSON but not an Optuna journal operation" in err
    assert digest(finished_run / RUN_FILE) == before


def test_sigterm_stops_a_run_as_sigint_does_with_one_line(
    model_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    import os
    import signal

    def terminated(*args: object, **kwargs: object) -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` or a job scheduler sends it

    monkeypatch.setattr(pipeline, "search_one", terminated)
    before = signal.getsignal(signal.SIGTERM)
    assert main(run_args(model_dir, tmp_path / "r", "--budget", "2")) == 143
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "skipsearch: terminated: no trial had finished, so nothing was kept; run the command again"
    )
    assert not (tmp_path / "r").exists()
    assert signal.getsignal(signal.SIGTERM) == before  # main gives the handler back
