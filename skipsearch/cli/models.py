"""`skipsearch models`: the registry aliases, their depth, source and offline availability."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from skipsearch.models.registry import ModelEntry


PIPE_WIDTH = 250  # wider than any row, so none is folded; the table takes only what it needs


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("models", help="list model aliases")
    parser.add_argument(
        "--assemble", metavar="ALIAS", help="join and verify an assembled GGUF now (used by `make qwen`)"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.errors import ModelLoadError
    from skipsearch.models.loading import resolve_gguf
    from skipsearch.models.registry import REGISTRY, available_offline

    if args.assemble:
        entry = REGISTRY.get(args.assemble)
        if entry is None or entry.kind == "hub":
            raise ModelLoadError(
                f"{args.assemble!r} is not an embedded or assembled alias: see `skipsearch models`"
            )
        print(resolve_gguf(entry))
        return 0
    console = Console()
    if not console.is_terminal:  # a pipe has no width: one line per alias, for grep and less -S
        console.width = PIPE_WIDTH
    console.print(models_table(REGISTRY.values(), available_offline))
    return 0


def models_table(entries: Iterable[ModelEntry], offline: Callable[[ModelEntry], bool]) -> Table:
    """One row per alias. The alias (what users copy into --model) is never wrapped or cut, at
    any width: it is sized to the longest one, and the other columns fold to make room."""
    entries = list(entries)
    table = Table(title="skipsearch models", box=box.SIMPLE_HEAD)
    table.add_column("alias", no_wrap=True, min_width=max(len(e.alias) for e in entries))
    for column in ("layers", "kind", "source", "offline", "description"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        table.add_row(
            entry.alias,
            str(entry.num_layers),
            entry.kind,
            entry.source,
            "yes" if offline(entry) else "no",
            entry.description,
        )
    return table
