"""The generated audit (`experiments/audit_inputs.py`, issue 51): it enumerates every option of
every sub-command the parser has, generates at least 300 cases, and judges a sample of them, each in
a fresh process, as the full run does (the full run's totals are in results/trust/audit.md)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path
from types import ModuleType

import pytest

from skipsearch import cli

EXPERIMENTS = Path(__file__).resolve().parents[3] / "experiments"


@pytest.fixture
def audit(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(EXPERIMENTS))  # the experiment imports its helpers as scripts do
    module = importlib.import_module("audit_inputs")
    helps = {name: parser.format_help() for name, parser in commands().items()}
    monkeypatch.setattr(module, "help_options", lambda command: module.options_in_help(helps[command]))
    monkeypatch.setattr(module, "help_text", lambda command: helps[command])
    return module


def commands() -> dict[str, argparse.ArgumentParser]:
    return next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_audit_enumerates_every_option_of_every_command(audit: ModuleType) -> None:
    assert set(audit.COMMANDS) == set(cli.COMMANDS)
    for name, parser in commands().items():
        expected = {
            (action.option_strings[-1], action.nargs != 0)
            for action in parser._actions
            if action.option_strings and not isinstance(action, argparse._HelpAction)
        }
        assert set(audit.options_in_help(parser.format_help())) == expected, name


def test_the_matrix_has_a_case_for_every_option_and_value(audit: ModuleType, tmp_path: Path) -> None:
    cases = audit.option_cases("tiny", tmp_path) + audit.path_cases("tiny", tmp_path)
    cases += audit.resume_cases(tmp_path) + audit.environment_cases("tiny", tmp_path)
    cases += audit.combination_cases("tiny", tmp_path) + audit.api_cases("tiny")
    assert len(cases) >= 1400  # with the format, read-only, foreign and interrupt ones: over 1,500
    for name, parser in commands().items():
        for action in parser._actions:
            if action.option_strings and not isinstance(action, argparse._HelpAction):
                covered = [
                    c for c in cases if c.argv and c.argv[0] == name and action.option_strings[-1] in c.argv
                ]
                assert len(covered) >= (6 if action.nargs != 0 else 1), (name, action.option_strings)
    refused = [
        c for c in cases if c.group == "value: nan" and c.argv and audit.bound_of(c.argv[0], c.argv[-2])
    ]
    assert refused and all(c.refuse for c in refused)  # nan is never legal where a bound is declared


SAMPLE = (  # one of each kind the audit found, each refused before any model work
    "speedup --gamma-max 99999999999999999999",
    "speedup --table-gammas inf",
    "plan with HOME relative",
    "plan with SKIPSEARCH_CACHE under a file",
    "measure --json a directory",
    "measure --json an over-long name",
    "profile --out an unwritable place",
    "export --out a file",
    "run --out empty",
    "compare --strategies twice",
    "run --strategy random --warm-start",
    "decode --top-k (rule)",
    "export --export-key a space",
    "search(budget=-1)",
    "decode(draft=None)",
)


def test_a_sample_of_the_matrix_passes_in_fresh_processes(
    audit: ModuleType, tmp_path: Path, model_dir: str
) -> None:
    """Each refused before any model work: a few seconds each."""
    fixtures = tmp_path / "fixtures"
    (fixtures / "run").mkdir(parents=True)  # no case here reaches the run itself
    (tmp_path / "home").mkdir()
    cases = audit.option_cases(model_dir, fixtures) + audit.path_cases(model_dir, fixtures)
    cases += audit.environment_cases(model_dir, fixtures) + audit.combination_cases(model_dir, fixtures)
    cases += audit.api_cases(model_dir)
    chosen = [c for c in cases if c.name in SAMPLE]
    assert len(chosen) == len(SAMPLE)
    for number, case in enumerate(chosen):
        outcome = audit.run_case(case, tmp_path, number)
        assert not outcome.failures and outcome.code == 2, (case.name, outcome.failures, outcome.last_line)


def test_every_rule_of_the_table_has_a_case_that_must_refuse(audit: ModuleType, tmp_path: Path) -> None:
    """The combination cases cover each `Applies` rule where its option exists, each expected to be
    refused where the rule's other option does not hold by default; every list option gets a duplicate."""
    from skipsearch.settings_rules import RULES, Applies

    cases = audit.combination_cases("tiny", tmp_path)
    refused = {c.argv[c.argv.index(o)] for c in cases if c.refuse for o in c.argv if o.startswith("--")}
    for rule in (r for r in RULES if isinstance(r, Applies)):
        option = "--" + rule.option.replace("_", "-")
        if any(option in dict(audit.help_options(command)) for command in audit.COMMANDS):
            assert option in refused, option
    duplicated = {c.name.split()[1] for c in cases if c.group == "combination: a list with a duplicate"}
    assert {"--strategies", "--tree", "--context-lengths", "--table-alphas", "--table-gammas"} <= duplicated
