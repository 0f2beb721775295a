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

COMMANDS = ("models", "measure", "speedup", "profile", "decode", "run", "compare", "report", "export")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="skipsearch", description="Find which layers a self-speculative draft should skip."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"skipsearch.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
