"""A journal torn anywhere inside its last record is repaired, and `--resume` finishes the budget."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from optuna.trial import TrialState

from skipsearch.search import load_study
from skipsearch.search.journal import repair_journal, whole_records_length
from skipsearch.store import JOURNAL_FILE
from tests.unit.search.conftest import CountingEvaluator, search

BUDGET = 4


def completed_masks(run_dir: Path) -> set[str]:
    study = load_study(run_dir, "random")
    return {t.user_attrs["mask"] for t in study.get_trials(states=(TrialState.COMPLETE,))}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("os.fsync", lambda fd: None)
        search(run_dir, "random", CountingEvaluator(), budget=BUDGET)
    return run_dir


def test_an_intact_journal_is_left_alone(finished_run: Path, tmp_path: Path) -> None:
    shutil.copytree(finished_run, tmp_path / "run")
    before = (tmp_path / "run" / JOURNAL_FILE).read_bytes()
    assert repair_journal(tmp_path / "run" / JOURNAL_FILE) is None
    assert (tmp_path / "run" / JOURNAL_FILE).read_bytes() == before


def test_truncated_anywhere_in_the_last_record_resume_keeps_every_completed_trial(
    finished_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = (finished_run / JOURNAL_FILE).read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    # The study as it was before its last record: what every repair must give back.
    before_last = tmp_path / "before-last"
    shutil.copytree(finished_run, before_last)
    (before_last / JOURNAL_FILE).write_bytes(data[:last_start])
    kept = completed_masks(before_last)
    assert len(kept) >= BUDGET - 1

    for cut in range(last_start + 1, len(data)):  # every byte offset strictly inside the last record
        run_dir = tmp_path / f"cut-{cut}"
        shutil.copytree(finished_run, run_dir)
        (run_dir / JOURNAL_FILE).write_bytes(data[:cut])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="skipsearch.search.journal"):
            result = search(run_dir, "random", CountingEvaluator(), budget=BUDGET, resume=True)
        repairs = [r for r in caplog.records if r.name == "skipsearch.search.journal"]
        assert len(repairs) == 1 and "torn record" in repairs[0].getMessage(), cut
        assert result.budget_used == BUDGET, cut
        assert kept <= completed_masks(run_dir), cut
        assert (run_dir / f"{JOURNAL_FILE}.torn-1").read_bytes() == data[:cut]
        journal = (run_dir / JOURNAL_FILE).read_bytes()
        assert whole_records_length(journal) == len(journal)  # nothing appended after a torn line
        shutil.rmtree(run_dir)


def test_records_appended_after_a_torn_line_are_cut_with_it(finished_run: Path, tmp_path: Path) -> None:
    """The journal an earlier resume damaged (a record fused to the torn line, more after it):
    the whole-record prefix survives, the rest goes to the backup, and the budget is finished."""
    data = (finished_run / JOURNAL_FILE).read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    damaged = data[: last_start + 5] + data[last_start:]
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    (run_dir / JOURNAL_FILE).write_bytes(damaged)
    assert repair_journal(run_dir / JOURNAL_FILE) == run_dir / f"{JOURNAL_FILE}.torn-1"
    assert (run_dir / JOURNAL_FILE).read_bytes() == data[:last_start]
    result = search(run_dir, "random", CountingEvaluator(), budget=BUDGET, resume=True)
    assert result.budget_used == BUDGET
    (run_dir / JOURNAL_FILE).write_bytes(damaged)
    assert repair_journal(run_dir / JOURNAL_FILE) == run_dir / f"{JOURNAL_FILE}.torn-2"  # never overwritten
