"""Settings judged as a whole (`skipsearch.settings_rules`): each kind of rule refuses what it must,
lets the rest through, and names the settings as the command line or the API spells them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from skipsearch.errors import ConfigError, SettingTypeError
from skipsearch.search.strategies import INFORMED, STRATEGIES
from skipsearch.settings_rules import API, CLI, LEARNED, check_arguments, judge
from skipsearch.settings_rules import INFORMED as RULES_INFORMED


def test_the_rules_know_the_strategies_the_search_has() -> None:
    assert set(RULES_INFORMED) == set(INFORMED) and set(LEARNED) <= set(STRATEGIES)


@pytest.mark.parametrize(
    ("settings", "given", "message"),
    [
        (
            {"warm_start": True, "strategy": "random"},
            {"warm_start"},
            "--warm-start does not apply with --strategy random",
        ),
        (
            {"sampler": "cmaes", "strategies": ["random", "uniform"]},
            {"sampler"},
            "--sampler cmaes does not apply",
        ),
        (
            {"importance": "measured", "strategy": "learned"},
            {"importance"},
            "--importance measured does not apply",
        ),
        ({"pareto": True, "objective": "acceptance"}, {"pareto"}, "--pareto does not apply with --objective"),
        ({"top_k": 5, "temperature": 0.0}, {"top_k"}, "--top-k 5 does not apply with --temperature 0.0"),
        (
            {"extrapolate_context": True, "context": None},
            {"extrapolate_context"},
            "does not apply without --context",
        ),
        ({"strategies": ["random", "random"]}, set(), "--strategies random,random names random twice"),
        ({"tree": ["2x1", "2x1 "]}, set(), "names 2x1 twice"),
        ({"export_key": " "}, set(), "--export-key ' ' is empty"),
        ({"out": ""}, set(), "--out '' is empty"),
        ({"mask": "|||"}, set(), "--mask '|||' is empty"),
        ({"prompts": ["\n"]}, set(), "--prompts '\\\\n' is empty"),
    ],
)
def test_a_combination_that_cannot_mean_what_was_typed_is_refused(
    settings: dict, given: set[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        judge(settings, given)


@pytest.mark.parametrize(
    ("settings", "given"),
    [
        ({"warm_start": True, "strategy": "learned"}, {"warm_start"}),
        ({"sampler": "cmaes", "strategies": ["random", "learned"]}, {"sampler"}),
        ({"sampler": "tpe", "strategy": "random"}, set()),  # the default, not typed: not a request
        ({"importance": "measured", "strategy": "knapsack"}, {"importance"}),
        ({"top_k": 5, "temperature": 0.7}, {"top_k"}),
        ({"skip": ""}, set()),  # the empty mask, as --skip's help says
        ({"strategies": ["random", "learned"], "tree": ["2x1", "2x2x1"]}, set()),
    ],
)
def test_what_can_mean_what_was_typed_passes(settings: dict, given: set[str]) -> None:
    judge(settings, given)


def test_the_api_names_keywords_not_flags() -> None:
    with pytest.raises(
        ConfigError, match=r"^sampler='cmaes' does not apply with strategy='random'.*drop sampler"
    ):
        judge({"sampler": "cmaes", "strategy": "random"}, {"sampler"}, API)
    with pytest.raises(ConfigError, match=r"^--sampler cmaes"):
        judge({"sampler": "cmaes", "strategy": "random"}, {"sampler"}, CLI)


def _hints() -> dict:
    return {"model": str | None, "budget": int | None, "trees": Sequence[str] | None, "temperature": float}


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        ({"model": 123}, SettingTypeError, r"^model=123 is an int, not a string or None"),
        ({"trees": "2x1"}, SettingTypeError, r"^trees='2x1' is a str, not a list of strings"),
        ({"trees": ["2x1", 3]}, SettingTypeError, "trees="),
        ({"budget": "thirty"}, SettingTypeError, "budget='thirty'"),
        ({"budget": True}, SettingTypeError, "budget=True"),
        ({"budget": 0}, ConfigError, r"^budget 0 is below 1: pass budget 1 or more"),
        ({"temperature": float("nan")}, ConfigError, "^temperature nan is not a finite number"),
    ],
)
def test_the_api_checks_types_and_ranges_by_keyword(values: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        check_arguments(_hints(), values)


def test_the_api_errors_are_value_and_type_errors() -> None:
    assert issubclass(SettingTypeError, TypeError) and issubclass(ConfigError, ValueError)
    check_arguments(_hints(), {"model": "m", "budget": 3, "trees": ["2x1"], "temperature": 1})


def test_a_file_setting_given_a_directory_is_refused_as_one(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"^--space .* is a directory: pass a space name"):
        judge({"space": str(tmp_path)}, set())
    judge({"space": "sparse"}, set())


def test_a_layer_list_naming_a_layer_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match="--skip 4-6,5 names 5 twice"):
        judge({"skip": "4-6,5"}, set())
    judge({"skip": "4-6,8", "attn_skip": ""}, set())
