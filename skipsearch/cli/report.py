"""`skipsearch report RUN`: regenerate tables and plots from a run directory (no model needed)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("report", help="tables and plots of a run directory")
    parser.add_argument("run_dir", help="a directory written by `skipsearch run`")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from skipsearch.run.report import write_run_outputs

    run_dir = Path(args.run_dir)
    write_run_outputs(run_dir)
    print((run_dir / "summary.md").read_text())
    print(f"rewrote trials.csv, best.json, summary.md and plots in {run_dir}")
    return 0
