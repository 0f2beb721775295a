"""Issue 20, from the command line: a run directory has one owner (`run/owner.py`), and a lock left
by a killed run is taken over.

The concurrency tests start real processes: a lock held by this test process stands in for a
live run (`flock` conflicts between processes as it does between two runs), and
`experiments/race.py` races two real runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skipsearch.cli import main
from skipsearch.errors import ConfigError
from skipsearch.run.owner import run_owner
from skipsearch.search.journal import FlockLock
from skipsearch.store import JOURNAL_FILE, LOCK_FILE
from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    REPOSITORY,
    cli,
    run_args,
    with_shared_kernels,
)

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


# -- one owner -------------------------------------------------------------------------------------
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


@pytest.mark.slow
def test_two_runs_raced_on_one_out_keep_one_owner(
    model_dir: str, tmp_path: Path, shared_kernels: Path
) -> None:
    """The stress script, a few races: one new-run race and one resume race (its processes find the
    session's kernels, through the cache the script reads them from)."""
    cache = with_shared_kernels(tmp_path / "kernels-cache", shared_kernels)
    env = {**os.environ, "PYTHONPATH": str(REPOSITORY), "SKIPSEARCH_CACHE": str(cache)}
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


def _finished_run(directory: Path) -> Path:
    """A run directory as report and export read it: run.yaml and a journal of whole records."""
    from skipsearch.config import RunConfig

    directory.mkdir()
    RunConfig(budget=3).save(directory / "run.yaml", {})
    (directory / JOURNAL_FILE).write_text('{"op_code": 0, "worker_id": "w", "study_name": "random"}\n')
    return directory


def _tree(directory: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.rglob("*"))}


def test_a_read_only_command_refuses_a_live_run_naming_its_owner(tmp_path: Path) -> None:
    from skipsearch.run.owner import check_read_only, live_owner

    run = _finished_run(tmp_path / "run")
    assert live_owner(run) is None  # no lock file: no owner
    with run_owner(run, resume=True):  # this process owns it, as a running `skipsearch run` would
        assert live_owner(run) == str(os.getpid())
        before = _tree(run)
        with pytest.raises(
            ConfigError, match=rf"being written by a skipsearch command \(pid {os.getpid()}\)"
        ):
            check_read_only(run, "report")
        assert _tree(run) == before
    assert live_owner(run) is None  # the lock file stays, its lock does not
    check_read_only(run, "report")


def test_a_read_only_command_leaves_a_torn_journal_to_resume(tmp_path: Path) -> None:
    from skipsearch.run.owner import check_read_only

    run = _finished_run(tmp_path / "run")
    with (run / JOURNAL_FILE).open("a") as journal:
        journal.write('{"op_code": 4, "wor')  # a writer killed mid-record
    before = _tree(run)
    for command in ("report", "export"):
        with pytest.raises(ConfigError, match=r"torn record.*skipsearch run --out .* --resume"):
            check_read_only(run, command)
        assert main([command, str(run)]) == 2
    assert _tree(run) == before  # not cut, no .torn-1 beside it, no studies/
