"""`skipsearch models`: the table stays readable piped and at 80 columns."""

from __future__ import annotations

import pytest
from rich.console import Console

from skipsearch.cli.models import models_table
from skipsearch.models.registry import REGISTRY
from tests.unit.conftest import (  # the tiny model directory and the one-line helpers
    cli,
)

pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_models_never_cuts_an_alias_at_80_columns() -> None:
    console = Console(width=80, record=True)
    console.print(models_table(REGISTRY.values(), lambda entry: True))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for alias in REGISTRY:
        assert any(alias in line for line in lines), alias


def test_models_piped_keeps_each_description_on_its_line() -> None:
    from skipsearch.models.registry import REGISTRY

    result = cli("models")
    assert result.returncode == 0, result.stderr
    for alias, entry in REGISTRY.items():
        assert any(alias in line and entry.description in line for line in result.stdout.splitlines()), alias
