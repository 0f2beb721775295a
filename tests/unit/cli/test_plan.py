"""`skipsearch plan`: the whole kernel plan with the timings behind each choice."""

from __future__ import annotations

import pytest

from skipsearch import cli
from skipsearch.models.plan import LINE_LIMIT


@pytest.mark.slow
def test_plan_prints_every_choice_and_the_one_line_form(capsys) -> None:
    assert cli.main(["plan", "--random-weights", "--num-layers", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("smollm2-135m on ") and lines[0].endswith(":")
    rows = [line.split()[0] for line in lines[1:-2]]
    assert rows[:2] == ["dtype", "attention"] and "threads" in rows
    line = lines[-2]
    assert line.startswith("kernel plan: ") and len(line) <= LINE_LIMIT
    assert "measured again when a kernel's build changes" in lines[-1]


def test_plan_refuses_a_bad_option_in_one_line(capsys) -> None:
    assert cli.main(["plan", "--num-layers", "2"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
