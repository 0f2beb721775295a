"""Every numeric setting's bound (`skipsearch.options`): refused values are one line naming the value
and a legal fix, and the fix it suggests is itself legal; the command line declares no numeric
option outside it."""

from __future__ import annotations

import argparse
import math
import re

import pytest

from skipsearch.cli import build_parser
from skipsearch.errors import ConfigError
from skipsearch.options import DECLARED, Bound, check, check_dtype, number_list

HOSTILE = (0, -1, float("nan"), float("inf"), float("-inf"), 10**30, "many", True, 1.5)


def legal(bound: Bound, value: object) -> bool:
    try:
        bound.check(value)
    except ConfigError:
        return False
    return True


def suggested(bound: Bound, message: str) -> float:
    """The value a refusal tells the user to pass (`pass --budget 1 or more`, `e.g. --top-p 1`)."""
    found = re.search(rf"{re.escape(bound.option)} (-?[\d.e+]+)(?: or (?:more|less))?$", message)
    assert found, message
    text = found.group(1)
    return int(text) if bound.kind is int else float(text)


@pytest.mark.parametrize("bound", DECLARED, ids=[b.name for b in DECLARED])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_refusal_names_the_value_and_a_fix_that_is_legal(bound: Bound, value: object) -> None:
    if legal(bound, value):
        assert isinstance(value, int | float) and math.isfinite(value)
        return
    with pytest.raises(ConfigError) as refused:
        bound.check(value)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{bound.option} ")
    assert legal(bound, suggested(bound, message)), message


@pytest.mark.parametrize("bound", DECLARED, ids=[b.name for b in DECLARED])
def test_the_example_and_the_ends_are_legal_and_just_past_them_is_not(bound: Bound) -> None:
    assert legal(bound, bound.example)
    for end, side, is_open in ((bound.low, -1, bound.low_open), (bound.high, 1, bound.high_open)):
        if end is None:
            continue
        beyond = end + side if bound.kind is int else math.nextafter(float(end), side * math.inf)
        assert legal(bound, bound.kind(end)) is not is_open
        assert not legal(bound, beyond)


def test_non_finite_numbers_are_never_legal() -> None:
    for bound in DECLARED:
        for value in (float("nan"), float("inf"), float("-inf")):
            assert not legal(bound, value), bound.name


def test_unset_is_unset_and_lists_check_every_item() -> None:
    assert check("context", None) is None
    assert number_list("context_length", "128, 512") == [128, 512]
    with pytest.raises(ConfigError, match="--context-lengths 0 is below 1: pass --context-lengths 1 or more"):
        number_list("context_length", "128,0")
    with pytest.raises(ConfigError, match="is empty"):
        number_list("alphas", ",")


def test_the_dtype_is_one_a_model_runs_in() -> None:
    assert check_dtype("torch.bfloat16") == "torch.bfloat16"
    with pytest.raises(ConfigError, match="--dtype 'int8' is not a dtype a model runs in: pass one of auto"):
        check_dtype("int8")


def numeric_actions() -> list[tuple[str, argparse.Action]]:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return [
        (name, action)
        for name, parser in commands.choices.items()
        for action in parser._actions
        if action.type is not None
    ]


def test_every_numeric_option_reads_its_declared_bound() -> None:
    """No `type=int` or `type=float` left: each typed option checks through `skipsearch.options`."""
    plain = [
        f"{name} {action.option_strings}" for name, action in numeric_actions() if action.type in (int, float)
    ]
    assert not plain
    names = {action.type.__name__ for _, action in numeric_actions()}
    assert names <= {"integer", "number", "list", "dtype_type"}, names
