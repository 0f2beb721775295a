"""The parser shared by every command: each help text states its default."""

from __future__ import annotations

import pytest

from skipsearch.cli import build_parser

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


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
