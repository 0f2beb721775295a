"""The audit's matrix in the suite (issue 51), its fast part: every option of every sub-command, as
the parser enumerates them, given 0, -1, nan, inf, a huge value and a wrong type, is either a value
the option's declared bound allows or one line and exit 2, never a traceback; non-finite numbers
are never accepted. In process: nothing here loads a model (the full matrix, each case a fresh
process running the command, is `experiments/audit_inputs.py`)."""

from __future__ import annotations

import argparse
import math

import pytest

from skipsearch.cli import build_parser, main

VALUES = ("0", "-1", "nan", "inf", "1e300", "99999999999999999999", "many")
POSITIONALS = {"report": ["some-run"], "export": ["some-run"]}


def options() -> list[tuple[str, argparse.Action]]:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (name, action)
        for name, parser in commands.choices.items()
        for action in parser._actions
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    ]


OPTIONS = options()


def exit_code(argv: list[str]) -> int | argparse.Namespace:
    """The exit code of parsing `argv`, or the parsed namespace when it parses."""
    try:
        return build_parser().parse_args(argv)
    except SystemExit as stop:
        return int(stop.code)


@pytest.mark.parametrize(
    ("command", "action"), OPTIONS, ids=[f"{c}{a.option_strings[-1]}" for c, a in OPTIONS]
)
def test_every_option_takes_a_legal_value_or_refuses_in_one_line(
    command: str, action: argparse.Action, capsys: pytest.CaptureFixture
) -> None:
    option = action.option_strings[-1]
    for value in VALUES if action.nargs != 0 else ("0",):
        parsed = exit_code([command, *POSITIONALS.get(command, []), option, value])
        err = capsys.readouterr().err
        if isinstance(parsed, argparse.Namespace):  # a value the option may take: finite, if a number
            number = getattr(parsed, action.dest)
            assert not isinstance(number, float) or math.isfinite(number), f"{command} {option} {value}"
            continue
        assert parsed == 2, (command, option, value, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("skipsearch: error: "), err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["speedup", "--gamma-max", "1000000000", "--alpha", "0.8", "--c", "0.3"],
            "pass --gamma-max 32 or less",
        ),
        (["run", "--gamma-max", "1000000000"], "pass --gamma-max 32 or less"),
        (["run", "--temperature", "nan"], "--temperature nan is not a finite number"),
        (["measure", "--temperature", "nan", "--skip", "2"], "--temperature nan is not a finite number"),
        (["run", "--seed", "-1"], "--seed -1 is below 0: pass --seed 0 or more"),
        (["run", "--seed", "99999999999999999999"], "pass --seed 4294967295 or less"),
        (["measure", "--dtype", "int8", "--skip", "2"], "--dtype 'int8' is not a dtype a model runs in"),
        (["decode", "--top-p", "0", "--skip", "2"], "--top-p 0.0 must be above 0"),
        (["profile", "--context-lengths", "128,nan"], "--context-lengths 'nan' is not an integer"),
        (["speedup", "--alphas", "0.9,nan", "--c", "0.3"], "--alphas nan is not a finite number"),
        (["speedup", "--gamma", "100", "--alpha", "0.8", "--c", "0.3"], "pass --gamma 32 or less"),
    ],
    ids=lambda value: " ".join(value[:3]) if isinstance(value, list) else "",
)
def test_the_audits_numbers_are_one_line_each(
    argv: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and message in err, err
