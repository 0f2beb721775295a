"""Issue 20, from the command line: a run directory has one owner, a resume keeps what was stored,
nothing outside the run is written through it, and the last tracebacks are one line each.

The concurrency tests start real processes: a lock held by this test process stands in for a
live run (`flock` conflicts between processes as it does between two runs), and
`experiments/race.py` races two real runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import torch

from skipsearch.cli import build_parser, main
from skipsearch.run import owner, pipeline
from skipsearch.run.owner import run_owner
from skipsearch.search.journal import FlockLock, repair_journal
from skipsearch.store import JOURNAL_FILE, LOCK_FILE, RUN_FILE, cache_dir
from tests.test_cli_trust import (  # the tiny model directory and the one-line helpers
    SMALL,
    cache_in_tmp,
    finished_run,
    model_dir,
    one_line_error,
    run_args,
)

__all__ = ["cache_in_tmp", "finished_run", "model_dir"]

REPOSITORY = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path = REPOSITORY) -> subprocess.CompletedProcess:
    """`skipsearch ARGS` in a new process, with this checkout and this test's cache."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    return subprocess.run(
        [sys.executable, "-m", "skipsearch", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- 1 and 3: one owner ---------------------------------------------------------------------------
@pytest.mark.parametrize("resume", [False, True], ids=["new-run", "resume-of-a-live-run"])
def test_a_second_command_on_a_held_run_is_one_line_naming_the_owner(
    finished_run: Path, model_dir: str, tmp_path: Path, resume: bool
) -> None:
    out = finished_run if resume else tmp_path / "new"
    before = sorted(p.name for p in out.iterdir()) if resume else None
    with run_owner(out, resume):
        result = cli(*run_args(model_dir, out, "--budget", "4", *(["--resume"] if resume else [])))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"in use by another skipsearch command (pid {os.getpid()})" in (
        result.stderr
    )
    if resume:
        assert sorted(p.name for p in out.iterdir()) == before  # the run is untouched


def test_a_lock_left_by_a_killed_run_is_taken_over_quietly(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK_FILE).write_text("999999\n")  # a dead pid; the kernel dropped its flock with it
    assert main(run_args(model_dir, out, "--budget", "2", "--strategy", "random")) == 0
    assert "2 masks scored" in capsys.readouterr().out


def test_optunas_journal_lock_dies_with_a_killed_writer(tmp_path: Path) -> None:
    """Optuna's symlink lock outlived a SIGKILL (20-30 s, 'Forcibly releasing'); a flock does not."""
    journal = tmp_path / JOURNAL_FILE
    journal.write_bytes(b"")
    code = (
        "import sys, time; from pathlib import Path; from skipsearch.search.journal import FlockLock; "
        f"FlockLock(Path({str(journal)!r})).acquire(); print('locked', flush=True); time.sleep(60)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "locked"
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    start = time.monotonic()
    lock = FlockLock(journal)
    lock.acquire()
    lock.release()
    assert time.monotonic() - start < 2.0


def test_two_runs_raced_on_one_out_keep_one_owner(model_dir: str) -> None:
    """The stress script, a few races: one new-run race and one resume race."""
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY)}
    result = subprocess.run(
        [sys.executable, str(REPOSITORY / "experiments" / "race.py"), "--races", "2", "--model", model_dir],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("new ", "resume "))]
    assert len(rows) == 2 and all(row[-4:] == ["0", "0", "0", "0"] for row in rows), result.stdout


# -- 2: a resume keeps the stored budget ----------------------------------------------------------
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


# -- 4: nothing outside the run is written through it ---------------------------------------------
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


# -- 5: --out must be new, empty or a run ----------------------------------------------------------
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
    assert "cannot create" in one_line_error(capsys, *run_args(model_dir, tmp_path / "file" / "run"))
    assert [p.name for p in (tmp_path / "src").iterdir()] == ["main.py"]


def test_an_unwritable_out_is_one_line_before_the_model_loads(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tests run as root, whom a read-only mode does not stop: the refusal is what the OS says."""
    monkeypatch.setattr(pipeline, "open_context", lambda *a: pytest.fail("the model was loaded"))

    def read_only(path: object, *args: object) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(owner.os, "open", read_only)
    assert "cannot write to --out" in one_line_error(capsys, *run_args(model_dir, tmp_path / "ro"))
    assert not (tmp_path / "ro").exists()


# -- 6: prompts against the model's context -------------------------------------------------------
def test_a_prompt_beyond_the_context_is_one_line_and_leaves_no_reference(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The tiny model's context is 256 tokens; humaneval prompts are longer in its tokenizer."""
    args = ["measure", "--model", model_dir, "--skip", "1", "--n-prompts", "2", "--max-prompt-tokens", "250"]
    assert "context of 256 tokens" in one_line_error(capsys, *args)
    assert not (cache_dir() / "reference").exists() or not any((cache_dir() / "reference").iterdir())


class Payload:
    """Unpickles as a call (harmless here), as a malicious weight file would."""

    def __reduce__(self) -> tuple:
        return (os.getpid, ())


# -- 7: tracebacks -------------------------------------------------------------------------------
def test_a_truncated_gguf_and_a_pickled_payload_are_one_line(
    model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    gguf = tmp_path / "bad.gguf"
    gguf.write_bytes(b"GGUF" + bytes(18))  # 22 bytes: the magic, then a header cut short
    assert "truncated" in one_line_error(capsys, "measure", "--model", str(gguf), "--skip", "1")
    evil = tmp_path / "evil"
    evil.mkdir()
    for path in Path(model_dir).iterdir():
        if path.suffix != ".safetensors":
            (evil / path.name).write_bytes(path.read_bytes())
    torch.save({"weight": Payload()}, evil / "pytorch_model.bin")
    assert "safetensors" in one_line_error(capsys, "measure", "--model", str(evil), "--skip", "1", *SMALL)


# -- 8: wrong or missing words --------------------------------------------------------------------
@pytest.mark.parametrize("context", ["0", "-5"])
def test_context_below_one_is_refused_even_with_extrapolation(
    model_dir: str, capsys: pytest.CaptureFixture, context: str
) -> None:
    args = ["measure", "--model", model_dir, "--skip", "1", "--context", context, "--extrapolate-context"]
    err = one_line_error(capsys, *args)
    assert "--context >= 1" in err and "--extrapolate-context" not in err.split(":", 2)[-1]


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


def test_report_on_a_run_stopped_short_says_incomplete(
    finished_run: Path, capsys: pytest.CaptureFixture
) -> None:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(finished_run / JOURNAL_FILE))
    )
    optuna.load_study(study_name="random", storage=storage).set_user_attr("budget", 6)  # as if killed at 3
    assert main(["report", str(finished_run)]) == 0
    assert "incomplete: 3 of 6 masks measured; `--resume` to finish" in capsys.readouterr().out


def test_a_bad_gamma_in_best_json_names_the_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"mask": "a:1|m:1", "gamma_best": -4}))
    err = one_line_error(capsys, "decode", "--from", str(best))
    assert str(best) in err and "gamma_best" in err


def test_help_states_every_default() -> None:
    import argparse

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    missing = [
        f"{name} {action.option_strings[0]}"
        for name, command in commands.items()
        for action in command._actions
        if action.option_strings
        and action.default not in (None, False, argparse.SUPPRESS)
        and "default" not in (action.help or "")
    ]
    assert missing == []


def test_models_piped_keeps_each_description_on_its_line() -> None:
    from skipsearch.models.registry import REGISTRY

    result = cli("models")
    assert result.returncode == 0, result.stderr
    for alias, entry in REGISTRY.items():
        assert any(alias in line and entry.description in line for line in result.stdout.splitlines()), alias


def test_a_mask_in_neither_form_hints_at_the_a_m_form(capsys: pytest.CaptureFixture) -> None:
    assert "a:4,14|m:4,14,20" in one_line_error(capsys, "measure", "--mask", "zz:1,2|q")


def test_the_empty_prompt_warning_prints_once(
    model_dir: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):"}\n{"prompt": "#"}\n')
    args = ["decode", "--model", model_dir, "--skip", "1", "--prompts", str(prompts), "--n-prompts", "2"]
    assert main([*args, "--new-tokens", "8", "--max-prompt-tokens", "32", "--repeats", "1"]) == 0
    capsys.readouterr()
    assert sum("zero tokens" in r.getMessage() for r in caplog.records) == 1
