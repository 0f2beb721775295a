"""`skipsearch` command line: one module per sub-command, each with `register` and `run`.

Sub-command modules import torch and friends inside `run`, so light commands (`speedup`,
`report`) start instantly. Every `SkipsearchError` becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from skipsearch.errors import SkipsearchError

COMMANDS = ("models", "plan", "measure", "speedup", "profile", "decode", "run", "compare", "report", "export")


_NOT_TYPED = object()


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
        prog="skipsearch", description="Find which layers a self-speculative draft should skip."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"skipsearch.cli.{name}").register(sub)
    return parser, sub.choices


def build_parser() -> argparse.ArgumentParser:
    return _build()[0]


def typed_options(argv: list[str], args: argparse.Namespace) -> frozenset[str]:
    """The options the user typed, as opposed to left at their default (even when typed equal
    to it): `run --resume` refuses a typed setting its stored run would ignore. Found by parsing
    `argv` again with every default of the command replaced by a marker."""
    parser, commands = _build()
    options = [dest for dest in vars(args) if dest != "handler"]
    commands[args.command].set_defaults(**dict.fromkeys(options, _NOT_TYPED))
    again = vars(parser.parse_args(argv))
    return frozenset(dest for dest in options if again[dest] is not _NOT_TYPED)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.typed = typed_options(argv, args)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.handler(args) or 0)
    except SkipsearchError as error:
        print(f"skipsearch: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("skipsearch: interrupted", file=sys.stderr)
        return 130
