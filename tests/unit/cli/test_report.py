"""`skipsearch report` on incomplete runs and on a comparison directory."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from skipsearch.cli import main
from skipsearch.store import JOURNAL_FILE
from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    one_line_error,
)

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


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


def test_report_on_a_run_stopped_short_says_incomplete(
    finished_run: Path, capsys: pytest.CaptureFixture
) -> None:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(finished_run / JOURNAL_FILE))
    )
    optuna.load_study(study_name="random", storage=storage).set_user_attr("budget", 6)  # as if killed at 3
    assert main(["report", str(finished_run)]) == 0
    assert "incomplete: 3 of 6 masks measured; `--resume` to finish" in capsys.readouterr().out
