"""`skipsearch models`: the registry aliases, their depth, source and offline availability."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


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
    table = Table(title="skipsearch models")
    for column in ("alias", "layers", "kind", "source", "offline", "description"):
        table.add_column(column)
    for entry in REGISTRY.values():
        offline = "yes" if available_offline(entry) else "no"
        table.add_row(
            entry.alias, str(entry.num_layers), entry.kind, entry.source, offline, entry.description
        )
    Console().print(table)
    return 0
